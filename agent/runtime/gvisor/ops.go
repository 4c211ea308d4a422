package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/cgroups"
	"github.com/berth-dev/berth/agent/runtime/sbinit"
)

// clientFor returns the host side of started sandbox id's init, waiting while it starts.
// Errors: sandbox_not_found.
func (r *Runtime) clientFor(ctx context.Context, id string) (*sbinit.Client, error) {
	sb, err := r.sandboxes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return r.client(sb), nil
}

// client returns the host side of sb's init: each stream is a relay process that `runsc
// exec` starts inside the sandbox (the init's socket lives in the sentry, out of the host's
// reach), with one end of a socket pair as its stdin and stdout.
func (r *Runtime) client(sb *sandbox) *sbinit.Client {
	return &sbinit.Client{
		Dial:  func(ctx context.Context) (net.Conn, error) { return r.relay(ctx, sb) },
		Gone:  func() bool { return sb.hasExited() || !r.sandboxes.Holds(sb.id, sb) },
		Label: "gvisor: sandbox " + sb.id,
	}
}

// relay starts one relay into sb and returns our end of it. Closing the connection ends
// the relay (its stdin and stdout close); the process is reaped in the background. Errors:
// conflict while a checkpoint freezes the sandbox, sandbox_not_found once it has ended.
func (r *Runtime) relay(ctx context.Context, sb *sandbox) (net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("gvisor: socket pair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "relay"), os.NewFile(uintptr(fds[1]), "relay-peer")
	defer theirs.Close()
	defer ours.Close() // net.FileConn dups it
	args := append([]string{"exec", "--user", fmt.Sprintf("%d:%d", sandboxUID, sandboxUID), "--cwd", "/tmp", sb.id},
		r.init.argv...)
	cmd := r.runscCmd(context.Background(), append(args, relayArg, initSock)...)
	var stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = theirs, theirs, &limitedWriter{w: &stderr, n: 4096}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	sb.mu.Lock()
	if sb.frozen {
		sb.mu.Unlock()
		return nil, berth.Errorf(berth.EConflict, "sandbox %s is being checkpointed", sb.id)
	}
	if sb.hasExited() {
		sb.mu.Unlock()
		return nil, berth.Errorf(berth.ESandboxNotFound, "sandbox %s has ended", sb.id)
	}
	err = cmd.Start()
	if err == nil {
		sb.relays[cmd] = nil
	}
	sb.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("gvisor: start a relay into %s: %w", sb.id, err)
	}
	go func() {
		cmd.Wait()
		sb.mu.Lock()
		delete(sb.relays, cmd)
		sb.mu.Unlock()
		if !cmd.ProcessState.Success() && stderr.Len() > 0 {
			r.log.Debug("gvisor: relay ended", "sandbox", sb.id, "state", cmd.ProcessState.String(), "stderr", stderr.String())
		}
	}()
	c, err := net.FileConn(ours)
	if err != nil {
		cmd.Process.Kill()
		return nil, fmt.Errorf("gvisor: relay conn: %w", err)
	}
	sb.mu.Lock()
	if _, live := sb.relays[cmd]; live {
		sb.relays[cmd] = c
	}
	sb.mu.Unlock()
	return c, nil
}

// killRelays ends every relay in flight into sb and waits (bounded) until they are gone.
// Each is first ended from our side — its connection closed, so the relay inside the
// sandbox reads the end of its input and exits, and with it `runsc exec` — and only then
// killed: killing `runsc exec` alone leaves the relay inside the sandbox holding our end of
// the socket pair, a host file a checkpoint cannot save (an app connection kept alive by
// the agent's proxy did exactly that).
func (r *Runtime) killRelays(sb *sandbox) {
	sb.mu.Lock()
	for _, c := range sb.relays {
		if c != nil {
			c.Close()
		}
	}
	sb.mu.Unlock()
	start := time.Now()
	for {
		sb.mu.Lock()
		n := len(sb.relays)
		if time.Since(start) > 2*time.Second { // a relay that did not end by itself
			for cmd := range sb.relays {
				cmd.Process.Kill()
			}
		}
		sb.mu.Unlock()
		if n == 0 || time.Since(start) > 7*time.Second {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

// Measurement is one reading of a sandbox's memory (AGT-3): the working set in MiB of its
// cgroup, which holds the sentry (and so the guest's memory, its /tmp included) and the
// gofer; Seen when the cgroup has processes and a usage; Exited once runsc has ended;
// OOMKills as the kernel counted them in the cgroup (C09).
type Measurement struct {
	ResidentMiB int64
	Seen        bool
	Exited      bool
	OOMKills    int64
}

// Measure reads the sandbox's cgroup (C24: usage minus inactive file pages). A sandbox still
// starting reads as not seen. When the kernel OOM killer ends a sandbox (it kills the sentry,
// and so the whole sandbox, and runsc exits 137), the reading after its exit keeps the last
// count seen, at least one. Errors: ESandboxNotFound.
func (r *Runtime) Measure(id string) (Measurement, error) {
	sb, ok := r.sandboxes.Peek(id)
	if !ok {
		return Measurement{}, berth.Errorf(berth.ESandboxNotFound, "no sandbox %s on this host", id)
	}
	if !sb.Ready() {
		return Measurement{}, nil // still starting (a failed start is gone from the registry)
	}
	m := Measurement{Exited: sb.hasExited()}
	dir := filepath.Join(r.memory.Path, r.cgroup, sb.id)
	if m.Exited {
		sb.mu.Lock()
		m.OOMKills = sb.oomKills
		sb.mu.Unlock()
		if killedByOOM(sb) && m.OOMKills == 0 {
			m.OOMKills = 1 // the kill came between two readings of the cgroup
		}
		return m, nil
	}
	usage, inactive, err := cgroups.Usage(dir, r.memory.V2)
	if err != nil {
		if sb.hasExited() {
			return Measurement{Exited: true}, nil
		}
		return m, fmt.Errorf("gvisor: measure %s: %w", id, err)
	}
	pids, _ := cgroups.Procs(dir)
	m.ResidentMiB = cgroups.WorkingSetMiB(usage, inactive)
	m.Seen = len(pids) > 0 && usage > 0
	m.OOMKills = cgroups.OOMKills(dir, r.memory.V2)
	sb.mu.Lock()
	sb.oomKills = m.OOMKills
	sb.mu.Unlock()
	return m, nil
}

// killedByOOM reports whether sb's sandbox ended because the kernel killed it: a sandbox
// nobody stopped whose runsc saw its sentry die of SIGKILL (the OOM killer kills the
// sentry, and so the whole sandbox). The guest cannot fake it: nothing it writes is read,
// and its init, PID 1 of its namespace, cannot be killed from inside.
func killedByOOM(sb *sandbox) bool {
	if sb.Stopping() {
		return false
	}
	ps := sb.run.ProcessState
	if ps == nil {
		return false
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		return true
	}
	return ps.ExitCode() == 128+int(syscall.SIGKILL)
}

// probe runs this runtime's init in a throwaway sandbox in probe mode and checks its answer:
// runsc works on this host, with this platform, and the init binary runs inside.
func (r *Runtime) probe() error {
	id := "berth-probe-" + strconv.Itoa(os.Getpid())
	bundle := filepath.Join(r.dir, bundlesDir, id)
	defer os.RemoveAll(bundle)
	spec := bundleSpec{ID: id, MemoryMiB: 256, TmpMiB: 16, PidsLimit: 16, Layout: r.builtin, Init: r.init,
		Cgroup: filepath.Join(r.cgroup, id)}
	if err := writeBundle(bundle, spec); err != nil {
		return err
	}
	// The probe's args: the init in probe mode.
	cfg := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(cfg)
	if err != nil {
		return fmt.Errorf("gvisor: probe: %w", err)
	}
	b = bytes.Replace(b, []byte(`"`+initArg+`"`), []byte(`"`+initArg+`", "-probe"`), 1)
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		return fmt.Errorf("gvisor: probe: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := r.runscCmd(ctx, "run", "--bundle", bundle, id)
	out, err := cmd.CombinedOutput()
	r.runscCmd(context.Background(), "delete", "--force", id).Run()
	if err != nil || !bytes.Contains(out, []byte(probeToken)) {
		return berth.Errorf(berth.EUnavailable, "gvisor: runsc (platform %s) cannot start a sandbox here: %v: %s",
			r.platform, err, tail(out, 600))
	}
	return nil
}

// brief keeps about n bytes of a command's output for an error: its first line (where runsc
// says what went wrong) and its end, one line each, without a panic's stack in between.
func brief(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	first, last := strings.TrimSpace(lines[0]), strings.TrimSpace(lines[len(lines)-1])
	if len(first) > n/2 {
		first = first[:n/2]
	}
	if len(last) > n/2 {
		last = last[len(last)-n/2:]
	}
	if len(lines) == 1 {
		return first
	}
	return first + " … " + last
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
