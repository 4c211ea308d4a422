package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/server"
)

// TestHostClassEveryForm: every spelling of a loopback or wildcard host that a resolver, the
// kernel or /etc/hosts reads as one is classified as one — case, one trailing dot, an IPv6
// zone, the inet_aton forms (a, a.b, a.b.c, a.b.c.d with decimal, octal or hex parts) and the
// loopback names of Debian's and Red Hat's /etc/hosts — and nothing else is (issue 13).
func TestHostClassEveryForm(t *testing.T) {
	for _, c := range []struct{ host, want string }{
		// wildcard: every interface, names no one address
		{"", "wildcard"},
		{"0.0.0.0", "wildcard"},
		{"0.0.0.0.", "wildcard"},
		{"::", "wildcard"},
		{"::%eth0", "wildcard"},
		{"0:0:0:0:0:0:0:0", "wildcard"},
		{"::ffff:0.0.0.0", "wildcard"},
		{"0", "wildcard"},
		{"0.0", "wildcard"},
		{"0.0.0", "wildcard"},
		{"00", "wildcard"},
		{"0x0", "wildcard"},
		{"0X00000000", "wildcard"},
		{"000.0x0.0.0", "wildcard"},
		// loopback: names
		{"localhost", "loopback"},
		{"LOCALHOST", "loopback"},
		{"localhost.", "loopback"},
		{"LocalHost.", "loopback"},
		{"a.localhost", "loopback"},
		{"a.b.LOCALHOST.", "loopback"},
		{"ip6-localhost", "loopback"},
		{"ip6-loopback", "loopback"},
		{"IP6-LOCALHOST.", "loopback"},
		{"localhost4", "loopback"},
		{"localhost6", "loopback"},
		{"localhost.localdomain", "loopback"},
		{"localhost4.localdomain4", "loopback"},
		{"localhost6.localdomain6.", "loopback"},
		// loopback: IPv4, every inet_aton spelling
		{"127.0.0.1", "loopback"},
		{"127.0.0.1.", "loopback"},
		{"127.255.255.254", "loopback"},
		{"127.1", "loopback"},
		{"127.0.1", "loopback"},
		{"127.1.", "loopback"},
		{"2130706433", "loopback"},
		{"0x7f000001", "loopback"},
		{"0X7F000001", "loopback"},
		{"017700000001", "loopback"},
		{"0177.0.0.1", "loopback"},
		{"0x7f.1", "loopback"},
		{"0x7f.0x0.0x0.0x1", "loopback"},
		{"127.000.000.001", "loopback"},
		{"127.0.0.010", "loopback"},
		{"127.1%lo", "loopback"},
		// loopback: IPv6
		{"::1", "loopback"},
		{"::1%lo", "loopback"},
		{"::1%1", "loopback"},
		{"0:0:0:0:0:0:0:1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"::FFFF:7F00:1", "loopback"},
		// remote: everything else, including what no resolver reads as an address
		{"10.0.0.5", "remote"},
		{"10.0.0.5.", "remote"},
		{"0x0a000005", "remote"},
		{"167772165", "remote"},
		{"128.1", "remote"},
		{"0.0.0.1", "remote"},
		{"host-1", "remote"},
		{"host-1.", "remote"},
		{"HOST-1.example.com", "remote"},
		{"fe80::1", "remote"},
		{"fe80::1%eth0", "remote"},
		{"2001:db8::5", "remote"},
		{"localhost.example.com", "remote"},
		{"notlocalhost", "remote"},
		{"localhostx", "remote"},
		{"127.0.0.1.nip.io", "remote"},
		{"localhost..", "remote"},
		{"256.1", "remote"},      // not an address: a first part over 255
		{"08", "remote"},         // not octal
		{"0x", "remote"},         // no hex digit
		{"1.2.3.4.5", "remote"},  // five parts
		{"4294967296", "remote"}, // over 32 bits
		{"127.0.0.256", "remote"},
	} {
		if got := hostClass(c.host); got != c.want {
			t.Errorf("hostClass(%q) = %q, want %q", c.host, got, c.want)
		}
	}
}

// TestAgentReachAdvertiseForms: --advertise is HOST[:PORT] — a PORT is 1..65535 in ASCII
// digits, HOST a dotted-quad IPv4, a bracketed IPv6 address without a zone, or a DNS name
// (letters, digits, hyphens; labels of 1..63 without a hyphen at either end; 253 at most) —
// and anything else is an invalid_request naming --advertise and the value; loopback and
// wildcard spellings in --advertise, --listen and the server URL are classified as such
// (issue 13).
func TestAgentReachAdvertiseForms(t *testing.T) {
	const remote, all = "http://replica-1:7070", "0.0.0.0:7071"
	label63 := strings.Repeat("a", 63)
	long := strings.Repeat(label63+".", 4)[:254] // 254 characters, no trailing dot
	for _, c := range []struct {
		name, server, listen, advertise string
		ok                              bool
	}{
		{"name and port", remote, all, "host-1:7071", true},
		{"name alone (the listener's port)", remote, "0.0.0.0:0", "host-1", true},
		{"upper case", remote, all, "HOST-1.Example.COM:7071", true},
		{"absolute name", remote, all, "host-1.example.com.:7071", true},
		{"lowest and highest ports", remote, all, "a:1", true},
		{"highest port", remote, all, "a:65535", true},
		{"63-character label", remote, all, label63 + ".example:7071", true},
		{"digits in labels", remote, all, "3com.1e100.net:7071", true},
		{"IPv4", remote, all, "10.0.0.5:7071", true},
		{"IPv6", remote, "[::]:7071", "[2001:db8::5]:7071", true},
		{"IPv6 alone", remote, "[::]:7071", "[2001:db8::5]", true},
		{"IPv4-mapped IPv6", remote, "[::]:7071", "[::ffff:10.0.0.5]:7071", true},

		{"empty port", remote, all, "host-1:", false},
		{"signed port", remote, all, "host-1:+7071", false},
		{"port 0", remote, all, "host-1:0", false},
		{"port over 65535", remote, all, "host-1:65536", false},
		{"huge port", remote, all, "host-1:99999999999999999999999", false},
		{"hex port", remote, all, "host-1:0x1f", false},
		{"port with underscore", remote, all, "host-1:7_071", false},
		{"non-ASCII digits", remote, all, "host-1:٧٠٧١", false},
		{"space", remote, all, "host-1:7071 ", false},
		{"two ports", remote, all, "host-1:7071:7072", false},
		{"scheme", remote, all, "http://host-1:7071", false},
		{"path", remote, all, "host-1/x:7071", false},
		{"user", remote, all, "user@host-1:7071", false},
		{"underscore", remote, all, "host_1:7071", false},
		{"leading hyphen", remote, all, "-host:7071", false},
		{"trailing hyphen", remote, all, "host-.example:7071", false},
		{"empty label", remote, all, "a..b:7071", false},
		{"leading dot", remote, all, ".host:7071", false},
		{"two trailing dots", remote, all, "host-1..:7071", false},
		{"64-character label", remote, all, label63 + "a.example:7071", false},
		{"name over 253", remote, all, long + ":7071", false},
		{"non-ASCII name", remote, all, "hôst:7071", false},
		{"empty host", remote, all, ":7071", false},
		{"empty brackets", remote, all, "[]:7071", false},
		{"IPv6 without brackets", remote, "[::]:7071", "2001:db8::5:7071", false},
		{"name in brackets", remote, all, "[host-1]:7071", false},
		{"IPv4 in brackets", remote, all, "[10.0.0.5]:7071", false},
		{"junk after brackets", remote, "[::]:7071", "[2001:db8::5]x", false},
		{"bracket, empty port", remote, "[::]:7071", "[2001:db8::5]:", false},
		{"IPv6 zone", remote, "[::]:7071", "[fe80::1%eth0]:7071", false},
		{"IPv4 zone", remote, all, "10.0.0.5%eth0:7071", false},
		{"hex IPv4", remote, all, "0x0a000005:7071", false},
		{"decimal IPv4", remote, all, "167772165:7071", false},
		{"short IPv4", remote, all, "10.1:7071", false},
		{"octal IPv4 part", remote, all, "010.0.0.5:7071", false},
		{"IPv4 part over 255", remote, all, "10.0.0.256:7071", false},
		{"five numeric parts", remote, all, "1.2.3.4.5:7071", false},
		{"numeric last label", remote, all, "host.1:7071", false},

		// loopback and wildcard spellings toward a server on another machine
		{"localhost.", remote, all, "localhost.:7071", false},
		{"LOCALHOST", remote, all, "LOCALHOST:7071", false},
		{"*.localhost", remote, all, "x.localhost:7071", false},
		{"ip6-localhost", remote, all, "ip6-localhost:7071", false},
		{"ip6-loopback", remote, all, "ip6-loopback:7071", false},
		{"localhost.localdomain", remote, all, "localhost.localdomain:7071", false},
		{"127.0.0.1.", remote, all, "127.0.0.1.:7071", false},
		{"127.1", remote, all, "127.1:7071", false},
		{"0x7f000001", remote, all, "0x7f000001:7071", false},
		{"2130706433", remote, all, "2130706433:7071", false},
		{"0", remote, all, "0:7071", false},
		{"0.0", remote, all, "0.0:7071", false},
		{"::1 with zone", remote, "[::]:7071", "[::1%lo]:7071", false},

		// --listen spellings that accept this host only, with a routable --advertise
		{"listen 127.1", remote, "127.1:7071", "host-1:7071", false},
		{"listen localhost.", remote, "localhost.:7071", "host-1:7071", false},
		{"listen ::1%lo", remote, "[::1%lo]:7071", "host-1:7071", false},
		{"listen ip6-localhost", remote, "ip6-localhost:7071", "host-1:7071", false},
		{"listen 0 (wildcard)", remote, "0:7071", "host-1:7071", true},

		// a server URL on this machine, however spelt: a loopback advertise is fine
		{"server 127.1", "http://127.1:7070", "127.0.0.1:0", "", true},
		{"server localhost.", "http://localhost.:7070", "127.0.0.1:0", "", true},
		{"server ::1%lo", "http://[::1%25lo]:7070", "127.0.0.1:0", "", true},
		{"server ip6-localhost", "http://ip6-localhost:7070", "127.0.0.1:0", "", true},
		{"server 0x7f000001", "http://0x7f000001:7070", "127.0.0.1:0", "", true},
		{"server LOCALHOST", "http://LOCALHOST:7070", "127.0.0.1:0", "localhost:7071", true},
	} {
		err := checkAgentReach(c.server, c.listen, c.advertise)
		if c.ok {
			if err != nil {
				t.Errorf("%s: --server %s --listen %s --advertise %q: %v, want it accepted", c.name, c.server, c.listen, c.advertise, err)
			}
			continue
		}
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		named := "--advertise"
		if c.advertise == "" || strings.HasPrefix(c.name, "listen") {
			named = "--listen"
		}
		t.Logf("%s: %s", c.name, msg)
		if berth.ErrorCode(err) != berth.EInvalidRequest || !strings.Contains(msg, named) || !strings.Contains(msg, c.advertise) {
			t.Errorf("%s: --server %s --listen %s --advertise %q: %v, want invalid_request naming %s and the value", c.name, c.server, c.listen, c.advertise, err, named)
		}
	}
}

// TestAgentBadAdvertiseWritesNothing: `berth agent` with a malformed --advertise (issue 13),
// or an --exec-inflight-mb below 0 or past 1 TiB, exits 2 naming the flag and the value
// before it writes anything — its --dir is not even created.
func TestAgentBadAdvertiseWritesNothing(t *testing.T) {
	t.Setenv("BERTH_NODE_TOKEN", server.NewKeySecret())
	for _, bad := range [][2]string{
		{"--advertise", "localhost:+7071"}, {"--advertise", "127.0.0.1:"},
		{"--exec-inflight-mb", "-1"}, {"--exec-inflight-mb", "1048577"},
	} {
		flag, value := bad[0], bad[1]
		dir := filepath.Join(t.TempDir(), "agent")
		args := []string{"agent", "--dir", dir, "--volume-dir", filepath.Join(dir, "volumes"), "--runtime", "process",
			"--server", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", flag, value}
		if os.Geteuid() != 0 {
			args = append(args, "--insecure")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // bounds an agent that wrongly starts
		err := Main(ctx, args, strings.NewReader(""), io.Discard, io.Discard)
		cancel()
		if exitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), flag) || !strings.Contains(fmt.Sprint(err), value) {
			t.Errorf("%s %q: %v (exit %d), want exit 2 naming %s and the value", flag, value, err, exitCode(err), flag)
		}
		if _, serr := os.Stat(dir); !os.IsNotExist(serr) {
			t.Errorf("%s %q: %s exists after the refusal (%v), want nothing written", flag, value, dir, serr)
		}
	}
}

// TestInetAton: inetAton gives the address glibc's inet_aton(3) gives for each form, and an
// error where glibc fails (the expectations are glibc 2.36's answers, via Python's
// socket.inet_aton).
func TestInetAton(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"0", "0.0.0.0"},
		{"0.0", "0.0.0.0"},
		{"000.0x0.0.0", "0.0.0.0"},
		{"127.1", "127.0.0.1"},
		{"127.0.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"0X7F000001", "127.0.0.1"},
		{"017700000001", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"0x7f.1", "127.0.0.1"},
		{"127.0.0.010", "127.0.0.8"},
		{"0x0a000005", "10.0.0.5"},
		{"167772165", "10.0.0.5"},
		{"010.0.0.5", "8.0.0.5"},
		{"1.16777215", "1.255.255.255"},
		{"255.255.255.255", "255.255.255.255"},
		{"4294967295", "255.255.255.255"},
		{"256.1", ""},
		{"1.16777216", ""},
		{"127.0.0.256", ""},
		{"4294967296", ""},
		{"99999999999999999999999", ""},
		{"08", ""},
		{"0x", ""},
		{"0x.1", ""},
		{"1.2.3.4.5", ""},
		{"127.0.0.1.", ""},
		{"+1", ""},
		{"-1", ""},
		{"1_0", ""},
		{"", ""},
		{"1..1", ""},
		{"host", ""},
	} {
		ip, err := inetAton(c.in)
		got := ""
		if err == nil {
			got = ip.String()
		}
		if got != c.want {
			t.Errorf("inetAton(%q) = %q (%v), want %q", c.in, got, err, c.want)
		}
	}
}
