package gvisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/cgroups"
	"github.com/berth-dev/berth/agent/runtime/driver"
	"github.com/berth-dev/berth/agent/runtime/rootfs"
)

// Spec is a sandbox to start. MemoryMiB is its memory limit in MiB (> 0); Template picks its
// root file system (Config.Rootfs, else the built-in one); VolumeDir, when set, is an
// existing host directory the sandbox sees at /tmp/volume (POOL-2).
type Spec struct {
	ID        string
	Template  string
	MemoryMiB int64
	VCPUs     int
	VolumeDir string
}

// sandbox is the runtime's record of one sandbox, in its registry from Start (or Restore)
// until its Stop is done.
type sandbox struct {
	driver.Life
	id     string
	bundle string // <Dir>/bundles/<id>
	spec   Spec

	run    *exec.Cmd     // the attached `runsc run` (or `runsc restore`)
	exited chan struct{} // closed once run has been reaped
	stderr tailBuffer    // the end of runsc's (and the container's) stderr

	mu       sync.Mutex
	frozen   bool                    // a checkpoint is under way: no new calls
	relays   map[*exec.Cmd]io.Closer // relays in flight → our end of each (nil until connected)
	oomKills int64                   // the latest reading of the cgroup's OOM kills
}

func (sb *sandbox) hasExited() bool {
	select {
	case <-sb.exited:
		return true
	default:
		return false
	}
}

// Start starts sandbox s and returns once its init serves. Errors: EInvalidRequest for a
// bad id, size or volume, EUnsupported when this host's root for the template is unusable,
// EConflict when the id is held, EUnavailable after Close; runtime
// failures are wrapped and quote runsc's log. A failed start leaves nothing behind.
func (r *Runtime) Start(ctx context.Context, s Spec) error {
	sb, err := r.admit(s)
	if err != nil {
		return err
	}
	return r.sandboxes.Started(sb.id, sb, r.boot(ctx, sb, nil), func() { r.teardown(sb) })
}

// admit validates s and records its sandbox as starting.
func (r *Runtime) admit(s Spec) (*sandbox, error) {
	if err := driver.ValidID(s.ID); err != nil {
		return nil, err
	}
	if s.MemoryMiB <= 0 {
		return nil, berth.Errorf(berth.EInvalidRequest, "memory must be positive, not %d MiB", s.MemoryMiB)
	}
	if s.VolumeDir != "" {
		if st, err := os.Stat(s.VolumeDir); err != nil || !st.IsDir() || !filepath.IsAbs(s.VolumeDir) {
			return nil, berth.Errorf(berth.EInvalidRequest, "volume %q must be an existing absolute directory", s.VolumeDir)
		}
		// The sandbox's user owns its volume's top directory (as on the process runtime),
		// or it could not write its own durable data.
		if err := os.Chown(s.VolumeDir, sandboxUID, sandboxUID); err != nil {
			return nil, fmt.Errorf("gvisor: volume %s: %w", s.VolumeDir, err)
		}
	}
	sb := &sandbox{
		Life: driver.NewLife(), id: s.ID, spec: s, bundle: filepath.Join(r.dir, bundlesDir, s.ID),
		exited: make(chan struct{}), relays: map[*exec.Cmd]io.Closer{},
	}
	if err := r.sandboxes.Admit(s.ID, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// layout returns the root file system of a template.
func (r *Runtime) layout(template string) (rootfs.Layout, error) {
	if dir, ok := r.cfg.Rootfs[template]; ok {
		return rootfs.Custom(dir)
	}
	return r.builtin, nil
}

// boot writes sb's bundle and starts it attached: `runsc run`, or `runsc restore` from
// image when it is set. A run waits for the init's "ok" line; a restore for the restored
// init to answer a ping (it said "ok" before its checkpoint).
func (r *Runtime) boot(ctx context.Context, sb *sandbox, image *string) error {
	layout, err := r.layout(sb.spec.Template)
	if err != nil {
		// This host's root for the template is unusable: its lack, not the request's fault
		// (another host may have it), so never invalid_request.
		return berth.Errorf(berth.EUnsupported, "template %s: this host's root file system for it is unusable: %v", sb.spec.Template, err)
	}
	os.RemoveAll(sb.bundle) // a leftover of a start that failed half-way
	if err := writeBundle(sb.bundle, bundleSpec{
		ID: sb.id, MemoryMiB: sb.spec.MemoryMiB, TmpMiB: tmpMiB(r.cfg.TmpMiB, sb.spec.MemoryMiB),
		PidsLimit: r.cfg.PidsLimit, Layout: layout, Init: r.init, VolumeDir: sb.spec.VolumeDir,
		Cgroup: filepath.Join(r.cgroup, sb.id),
	}); err != nil {
		return err
	}
	// The container's stdio are pipes this runtime drains, never host files: the guest can
	// reach them through /proc/1/fd, and a file would let it write to the host's disk
	// (the escape suite's "writes through the init's inherited descriptors"). Stderr (also
	// runsc's own messages) is kept as a bounded tail for error reports.
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	defer outR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		outW.Close()
		return fmt.Errorf("gvisor: %w", err)
	}
	go sb.stderr.drain(errR)
	args := []string{"run", "--bundle", sb.bundle, sb.id}
	if image != nil {
		args = []string{"restore", "--bundle", sb.bundle, "--image-path", *image, sb.id}
	}
	// Attached (no --detach): the sandbox dies with this runsc process, which the spawner
	// starts with PDEATHSIG, so no sandbox outlives its agent.
	cmd := r.runscCmd(context.Background(), args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, outW, errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	err = r.spawner.Start(cmd)
	outW.Close()
	errW.Close()
	if err != nil {
		return fmt.Errorf("gvisor: start %s: %w", sb.id, err)
	}
	sb.run = cmd
	go func() { driver.WaitExit(cmd); close(sb.exited) }() // no OS thread held while it runs
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if image != nil {
		return r.waitRestored(ctx, sb)
	}
	return waitReady(ctx, outR, sb)
}

// waitReady reads the init's one-line verdict from its stdout: "ok", or "error: …", or EOF
// if the sandbox died (the error then quotes the end of runsc's log).
func waitReady(ctx context.Context, out *os.File, sb *sandbox) error {
	stop := context.AfterFunc(ctx, func() { out.SetReadDeadline(time.Now()) })
	defer stop()
	line, err := bufio.NewReader(out).ReadString('\n')
	line = strings.TrimSpace(line)
	switch {
	case line == "ok":
		// The rest of the init's stdout is not read: keep the pipe from filling.
		go io.Copy(io.Discard, out)
		return nil
	case strings.HasPrefix(line, "error: "):
		return fmt.Errorf("gvisor: init of %s: %s", sb.id, strings.TrimPrefix(line, "error: "))
	case ctx.Err() != nil:
		return fmt.Errorf("gvisor: waiting for init of %s: %w (runsc log: %s)", sb.id, ctx.Err(), sb.stderr.String())
	case errors.Is(err, io.EOF):
		return fmt.Errorf("gvisor: sandbox %s exited before its init was ready: %s", sb.id, sb.stderr.String())
	default:
		return fmt.Errorf("gvisor: waiting for init of %s: %w", sb.id, err)
	}
}

// tailBuffer keeps the last tailBytes written to it, for error messages; drain copies a
// pipe into it until EOF. Safe for concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

const tailBytes = 2048

func (t *tailBuffer) drain(r *os.File) {
	defer r.Close()
	b := make([]byte, 32<<10)
	for {
		n, err := r.Read(b)
		t.mu.Lock()
		t.buf = append(t.buf, b[:n]...)
		if len(t.buf) > tailBytes {
			t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailBytes:]...)
		}
		t.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// String returns the kept tail, trimmed, valid UTF-8.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.ToValidUTF8(strings.TrimSpace(string(t.buf)), "")
}

// Stop stops the sandbox: it kills the container, waits for runsc, deletes the container
// (and with it its cgroup) and removes its bundle. Stop is idempotent: an unknown or already
// stopped id is not an error. Concurrent Stops of one id all wait for the same teardown.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	return r.sandboxes.Stop(ctx, id, r.teardown)
}

// teardown kills and removes whatever of sb exists. Its waits are bounded so a stuck runsc
// cannot hang the agent; what remains is cleaned by the next New.
func (r *Runtime) teardown(sb *sandbox) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r.killRelays(sb)
	var errs []error
	if sb.run != nil && !sb.hasExited() {
		r.runscCmd(ctx, "kill", sb.id, "KILL").Run()
		select {
		case <-sb.exited:
		case <-time.After(5 * time.Second):
			// runsc did not end with its container: end it (it is our child, by pid).
			sb.run.Process.Kill()
			select {
			case <-sb.exited:
			case <-ctx.Done():
				errs = append(errs, fmt.Errorf("gvisor: runsc of %s did not exit: %w", sb.id, ctx.Err()))
			}
		}
	}
	if out, err := r.runscCmd(ctx, "delete", "--force", sb.id).CombinedOutput(); err != nil &&
		!strings.Contains(string(out), "does not exist") {
		errs = append(errs, fmt.Errorf("gvisor: delete %s: %v: %s", sb.id, err, strings.TrimSpace(string(out))))
	}
	// runsc leaves the cgroup of a checkpointed or restored container behind (empty).
	cgroups.RemoveEmpty(filepath.Join(r.cgroup, sb.id))
	if err := os.RemoveAll(sb.bundle); err != nil {
		errs = append(errs, fmt.Errorf("gvisor: remove %s: %w", sb.bundle, err))
	}
	return errors.Join(errs...)
}
