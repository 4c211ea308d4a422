package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/berth-dev/berth"
)

// The multi-host knobs of `berth server` and `berth agent` (README "Many replicas on
// PostgreSQL"; docs/DECISIONS.md "Agents on many hosts"). Every refusal here is an
// invalid_request, so the command exits 2 before it starts anything.

// defaultAgentID is the default of `berth agent --id`: "<hostname>-<8 hex digits of the
// SHA-256 of the absolute --dir>". Two agents on one host differ because they cannot share a
// --dir (lockAgentDir), and one agent keeps its id across restarts while its --dir stays.
// An empty hostname gives "agent-<hash>".
func defaultAgentID(hostname, dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("agent id from --dir %s: %w", dir, err)
	}
	sum := sha256.Sum256([]byte(filepath.Clean(abs)))
	if hostname == "" {
		hostname = "agent"
	}
	return hostname + "-" + hex.EncodeToString(sum[:4]), nil
}

// agentLockFile is the file in --dir that one running agent holds an exclusive flock on.
const agentLockFile = "agent.lock"

// lockAgentDir makes dir (0711, as the runtimes do) and takes an exclusive lock on
// dir/agent.lock, so a second agent on the same directory — which would clean up the first's
// sandboxes as leftovers and report under the same id — refuses to start (invalid_request,
// naming the pid that holds it). The lock ends with the process; release ends it sooner.
func lockAgentDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("agent dir: %w", err)
	}
	path := filepath.Join(dir, agentLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("agent dir: %w", err)
	}
	if busy, err := tryLock(f); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if busy {
			return nil, berth.Errorf(berth.EInvalidRequest, "another agent (pid %s) runs with --dir %s; give each agent on a host its own --dir",
				strings.TrimSpace(string(holder)), dir)
		}
		return nil, fmt.Errorf("agent dir: lock %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { _ = f.Close() }, nil
}

// tryLock takes an exclusive flock on f without waiting. busy says another open file holds
// it (EWOULDBLOCK); any other error is the system's. The lock lasts until f is closed or the
// process ends. `berth agent`'s --dir and `berth dev`'s --data are locked with it.
func tryLock(f *os.File) (busy bool, err error) {
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	return errors.Is(err, syscall.EWOULDBLOCK), err
}

// checkAgentReach checks that the servers can dial the agent (issue 13): serverURL must be an
// http(s) URL with a host; listen a HOST:PORT; advertise "" or HOST[:PORT] as parseAdvertise
// reads it. Hosts are classified by hostClass, so every spelling of loopback counts. It
// refuses an agent that would advertise a loopback or wildcard address (its own --listen, or
// --advertise) to a server on another machine, and a non-loopback --advertise while --listen
// accepts only this host's connections. A server URL whose host hostClass calls loopback or
// wildcard is on this machine; any other name is taken to be another machine (no DNS lookup).
func checkAgentReach(serverURL, listen, advertise string) error {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return berth.Errorf(berth.EInvalidRequest, "--server wants a URL such as http://replica-1:7070, not %q", serverURL)
	}
	if err := listenAddrProblem(listen); err != nil {
		return berth.Errorf(berth.EInvalidRequest, "cannot listen on %s: %v; --listen wants HOST:PORT (0.0.0.0:7071 for every interface)", listen, err)
	}
	lhost, _, _ := net.SplitHostPort(listen) // checked just above
	adv, shown := lhost, listen
	if advertise != "" {
		h, err := parseAdvertise(advertise)
		if err != nil {
			return err
		}
		if hostClass(h) == "wildcard" {
			return berth.Errorf(berth.EInvalidRequest, "--advertise %q names every interface, not one address the servers can dial: give this host's name or address (e.g. host-1:7071)", advertise)
		}
		if hostClass(h) == "remote" && hostClass(lhost) == "loopback" {
			return berth.Errorf(berth.EInvalidRequest, "--listen %s accepts connections from this host only, but --advertise %s is for other machines: "+
				"listen on 0.0.0.0:PORT (every interface) or on this host's address", listen, advertise)
		}
		adv, shown = h, advertise
	}
	if hostClass(u.Hostname()) == "remote" && hostClass(adv) != "remote" {
		return berth.Errorf(berth.EInvalidRequest, "the server %s is on another machine, but this agent would tell it to dial %s, which it cannot reach: "+
			"set --advertise HOST:PORT to this host's address and --listen to one that accepts it (e.g. --listen 0.0.0.0:7071 --advertise host-1:7071)",
			serverURL, shown)
	}
	return nil
}

// listenAddrProblem says why addr can never be bound as a --listen address of `berth dev`,
// `berth server` or `berth agent`, or returns nil: addr must be HOST:PORT (HOST empty: every
// interface) with PORT 0..65535 or a service name. The parsing is net's own (SplitHostPort,
// then LookupPort, which reads only the local services table), so every spelling net.Listen
// binds passes; HOST is not looked up, so a name that does not resolve fails at the bind, as
// a port in use does. The error is net's: "address notaport: missing port in address".
func listenAddrProblem(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	_, err = net.LookupPort("tcp", port)
	return err
}

// hostClass says who can reach host, read the way the C resolver, the kernel and /etc/hosts
// read it but with no lookup (issue 13): "wildcard" (empty, 0.0.0.0, ::: every interface,
// which names no one address), "loopback" (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104, localhost,
// *.localhost and the other loopback names of Debian's and Red Hat's /etc/hosts) or "remote"
// (anything else, other names included). Before classifying it lower-cases host and drops
// surrounding space, an IPv6 zone ("%eth0") and one trailing dot, and reads an all-numeric
// host the inet_aton way (inetAton), so "LOCALHOST.", "::1%lo", "127.1", "0x7f000001",
// "2130706433", "0" and "0.0" are what the resolver makes of them.
func hostClass(host string) string {
	if strings.TrimSpace(host) == "" {
		return "wildcard"
	}
	h := normalHost(host)
	ip, err := netip.ParseAddr(h)
	if err != nil {
		ip, err = inetAton(h)
	}
	ip = ip.Unmap()
	switch {
	case err == nil && ip.IsUnspecified():
		return "wildcard"
	case err == nil && ip.IsLoopback(), loopbackName(h):
		return "loopback"
	}
	return "remote"
}

// normalHost is host lower-cased, without surrounding space, an IPv6 zone (from the first
// "%") or one trailing dot (a fully qualified name means the same host).
func normalHost(host string) string {
	h := strings.ToLower(strings.TrimSpace(host))
	if i := strings.IndexByte(h, '%'); i >= 0 {
		h = h[:i]
	}
	return strings.TrimSuffix(h, ".")
}

// loopbackNames are the names that /etc/hosts maps to a loopback address on Debian
// (ip6-localhost, ip6-loopback) and Red Hat (localhost4, localhost6, *.localdomain*), beside
// localhost and *.localhost (RFC 6761) which loopbackName checks by rule.
var loopbackNames = map[string]bool{
	"localhost": true, "ip6-localhost": true, "ip6-loopback": true,
	"localhost4": true, "localhost6": true, "localhost.localdomain": true,
	"localhost4.localdomain4": true, "localhost6.localdomain6": true,
}

// loopbackName says whether the normalised name h means this host by convention.
func loopbackName(h string) bool {
	return loopbackNames[h] || strings.HasSuffix(h, ".localhost")
}

// inetAton reads s as glibc's inet_aton does: 1 to 4 parts separated by dots, each decimal,
// octal (a leading 0) or hex (a leading 0x, at least one hex digit); every part but the
// last is one byte and the last fills the remaining bytes (a = 32 bits, a.b = 8.24,
// a.b.c = 8.8.16, a.b.c.d = 8.8.8.8). Anything else — a sign, an empty part, "08", a value
// too big for its place, five parts — is an error.
func inetAton(s string) (netip.Addr, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, fmt.Errorf("inet_aton %q: more than 4 parts", s)
	}
	var addr uint32
	for i, p := range parts {
		base, digits := 10, p
		switch {
		case len(p) > 1 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X'):
			base, digits = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		bits := 8
		if i == len(parts)-1 {
			bits = 8 * (5 - len(parts))
		}
		// base != 0, so ParseUint takes no sign, underscore or prefix: digits only.
		v, err := strconv.ParseUint(digits, base, bits)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("inet_aton %q: part %q: %w", s, p, err)
		}
		if i == len(parts)-1 {
			addr |= uint32(v)
		} else {
			addr |= uint32(v) << (24 - 8*i)
		}
	}
	return netip.AddrFrom4([4]byte{byte(addr >> 24), byte(addr >> 16), byte(addr >> 8), byte(addr)}), nil
}

// parseAdvertise checks `berth agent --advertise` (issue 13) and returns its host, without
// brackets. adv is HOST or HOST:PORT (then the listener's port): PORT is 1..65535 in ASCII
// digits; HOST is a dotted-quad IPv4 address, an IPv6 address in brackets without a zone (a
// zone names an interface of this host, which the servers do not have), or a DNS name —
// letters, digits and hyphens in dot-separated labels of 1..63 characters that neither start
// nor end with a hyphen, 253 characters at most, one optional trailing dot, and a last label
// that is not a number. A host the C resolver would read as an IPv4 address in another form
// ("127.1", "0x0a000005", "010.0.0.5") is refused with its dotted-quad spelling, since the
// servers' resolver may read it differently. Any other value is an invalid_request naming
// --advertise and the value.
func parseAdvertise(adv string) (string, error) {
	bad := func(format string, args ...any) error {
		return berth.Errorf(berth.EInvalidRequest, "--advertise %q: %s; want HOST[:PORT] that the servers can dial, such as host-1:7071, 10.0.0.5:7071 or [2001:db8::5]:7071",
			adv, fmt.Sprintf(format, args...))
	}
	if strings.Contains(adv, "://") {
		return "", bad("no scheme")
	}
	host, port, hasPort := adv, "", false
	if strings.HasPrefix(adv, "[") {
		end := strings.IndexByte(adv, ']')
		if end < 0 {
			return "", bad("no closing ]")
		}
		host = adv[1:end]
		switch rest := adv[end+1:]; {
		case rest == "":
		case rest[0] == ':':
			port, hasPort = rest[1:], true
		default:
			return "", bad("%q after the ]", rest)
		}
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is6() {
			return "", bad("[%s] is not an IPv6 address (only IPv6 addresses go in brackets)", host)
		}
		if ip.Zone() != "" {
			return "", bad("the zone %%%s names an interface of this host, which the servers do not have", ip.Zone())
		}
	} else {
		switch strings.Count(adv, ":") {
		case 0:
		case 1:
			i := strings.IndexByte(adv, ':')
			host, port, hasPort = adv[:i], adv[i+1:], true
		default:
			return "", bad("more than one ':' (an IPv6 address goes in brackets: [2001:db8::5]:7071)")
		}
		if err := checkAdvertiseHost(host); err != "" {
			return "", bad("%s", err)
		}
	}
	if hasPort {
		if port == "" {
			return "", bad("no port after the ':' (leave the ':' out for the listener's port)")
		}
		n, err := strconv.ParseUint(port, 10, 16) // base 10: ASCII digits only, no sign
		if err != nil || n == 0 {
			return "", bad("the port %q is not a number in 1..65535", port)
		}
	}
	return host, nil
}

// checkAdvertiseHost says what is wrong with an unbracketed --advertise host, or "" when it
// is a dotted-quad IPv4 address or a DNS name (see parseAdvertise).
func checkAdvertiseHost(host string) string {
	if host == "" {
		return "no host"
	}
	if i := strings.IndexByte(host, '%'); i >= 0 {
		return fmt.Sprintf("the zone %s names an interface of this host, which the servers do not have", host[i:])
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
		return ""
	}
	name := strings.TrimSuffix(host, ".")
	labels := strings.Split(name, ".")
	if last := strings.ToLower(labels[len(labels)-1]); last != "" && strings.Trim(last, "0123456789") == "" ||
		strings.HasPrefix(last, "0x") && strings.Trim(last[2:], "0123456789abcdef") == "" {
		if ip, err := inetAton(strings.ToLower(name)); err == nil && ip.IsUnspecified() {
			return fmt.Sprintf("%s is 0.0.0.0, every interface, which names no one address", host)
		} else if err == nil {
			return fmt.Sprintf("%s is the IPv4 address %s in a form the servers' resolver may not read; write %s", host, ip, ip)
		}
		return fmt.Sprintf("%s is neither an IPv4 address (a.b.c.d, each 0..255) nor a DNS name (whose last label is not a number)", host)
	}
	if len(name) > 253 {
		return fmt.Sprintf("the name is %d characters long, more than 253", len(name))
	}
	for _, l := range labels {
		switch {
		case l == "":
			return fmt.Sprintf("%q has an empty label", host)
		case len(l) > 63:
			return fmt.Sprintf("the label %.20s… is %d characters long, more than 63", l, len(l))
		case l[0] == '-' || l[len(l)-1] == '-':
			return fmt.Sprintf("the label %q starts or ends with a hyphen", l)
		}
		for _, r := range l {
			if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-') {
				return fmt.Sprintf("%q is not a letter, digit, hyphen or dot, so %s is not a DNS name", r, host)
			}
		}
	}
	return ""
}

// minAdminKeyLen is the shortest BERTH_ADMIN_KEY a replica accepts (openssl rand -hex 32
// gives 64 characters).
const minAdminKeyLen = 32

// serverAdminKey makes the admin key of `berth server` valid in the store and says where it
// is, for the startup line: envKey (BERTH_ADMIN_KEY, the same on every replica) when set —
// refused (invalid_request) when shorter than minAdminKeyLen or with white space — else the
// key kept in path, created on first start (ensureAdminKey). Keys live in the shared store,
// so a key any replica made works against every replica.
func serverAdminKey(ctx context.Context, st berth.TenantStore, envKey, path string) (string, error) {
	if envKey == "" {
		if _, err := ensureAdminKey(ctx, st, path); err != nil {
			return "", err
		}
		return "in " + path, nil
	}
	if len(envKey) < minAdminKeyLen || strings.ContainsAny(envKey, " \t\r\n") {
		return "", berth.Errorf(berth.EInvalidRequest, "BERTH_ADMIN_KEY must be at least %d characters without spaces (e.g. openssl rand -hex 32), not %d",
			minAdminKeyLen, len(envKey))
	}
	if err := registerAdminKey(ctx, st, envKey); err != nil {
		return "", err
	}
	return "from BERTH_ADMIN_KEY", nil
}
