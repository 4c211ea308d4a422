package process

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-dev/berth"
)

// lookup returns the started sandbox id, waiting while it starts. Errors: ESandboxNotFound.
func (r *Runtime) lookup(ctx context.Context, id string) (*sandbox, error) {
	r.mu.Lock()
	sb := r.sandboxes[id]
	r.mu.Unlock()
	if sb == nil {
		return nil, berth.Errorf(berth.ESandboxNotFound, "no sandbox %s on this host", id)
	}
	select {
	case <-sb.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("process: sandbox %s is starting: %w", id, ctx.Err())
	}
	if sb.startErr != nil {
		return nil, berth.Errorf(berth.ESandboxNotFound, "sandbox %s failed to start", id)
	}
	return sb, nil
}

// holds reports whether sb is still the runtime's record for its id.
func (r *Runtime) holds(sb *sandbox) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sandboxes[sb.id] == sb
}

// Exec runs req.Cmd inside the sandbox (cwd /tmp; PATH /usr/local/bin:/usr/bin:/bin, then the
// agent's) and returns when the command exits; background processes it started keep running.
// Stdout and stderr are capped at 1 MiB each (a note on stderr says what was dropped).
// TimeoutS defaults to 60 s; a timeout is not an error: the process group is killed, the exit
// code is -1 and stderr ends with a note. A signal death gives 128+signal, an unknown command
// 127. Errors: EInvalidRequest (empty cmd, negative timeout), ESandboxNotFound; a cancelled ctx
// kills the command and returns ctx's error wrapped.
func (r *Runtime) Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return berth.ExecResult{}, berth.Errorf(berth.EInvalidRequest, "cmd must not be empty")
	}
	if req.TimeoutS < 0 {
		return berth.ExecResult{}, berth.Errorf(berth.EInvalidRequest, "timeout_s must not be negative")
	}
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return berth.ExecResult{}, err
	}
	resp, _, err := r.call(ctx, sb, wireRequest{Op: opExec, Cmd: req.Cmd, Stdin: req.Stdin, TimeoutS: req.TimeoutS}, nil)
	if err != nil {
		return berth.ExecResult{}, err
	}
	return berth.ExecResult{ExitCode: resp.ExitCode, Stdout: resp.Stdout, Stderr: resp.Stderr}, nil
}

// WriteFile writes data to path as the sandbox sees it (so /tmp/x is the sandbox's private
// /tmp), creating parent directories; at most 64 MiB. Errors: EInvalidRequest (relative path,
// path is a directory), ETooLarge, ESandboxNotFound.
func (r *Runtime) WriteFile(ctx context.Context, id, path string, data []byte) error {
	if err := checkPath(path); err != nil {
		return err
	}
	if len(data) > maxFileBytes {
		return berth.Errorf(berth.ETooLarge, "file of %d bytes is over %d", len(data), maxFileBytes)
	}
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return err
	}
	_, _, err = r.call(ctx, sb, wireRequest{Op: opWrite, Path: path, Size: int64(len(data))}, data)
	return err
}

// ReadFile returns the content of path as the sandbox sees it; at most 64 MiB. Errors:
// EInvalidRequest (relative path, directory), ENotFound (no such file), ETooLarge,
// ESandboxNotFound.
func (r *Runtime) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	_, data, err := r.call(ctx, sb, wireRequest{Op: opRead, Path: path}, nil)
	return data, err
}

func checkPath(path string) error {
	if !filepath.IsAbs(path) {
		return berth.Errorf(berth.EInvalidRequest, "path %q must be absolute", path)
	}
	return nil
}

// Measurement is one reading of a sandbox's memory (AGT-3). ResidentMiB is the working set in
// MiB; Seen is true when the reading saw the guest's processes (the reserve of ADM-5 may be
// released); Exited is true once the init is gone (the sandbox ended on its own).
type Measurement struct {
	ResidentMiB int64
	Seen        bool
	Exited      bool
	OOMKills    int64 // processes the kernel OOM killer killed in the sandbox's cgroup (C09)
}

// Measure reads the sandbox's resident memory. With isolation it is the cgroup's working set,
// the kubelet's definition (C24): usage minus inactive file pages (v1 memory.usage_in_bytes −
// total_inactive_file, v2 memory.current − inactive_file), floored at 0, rounded to the
// nearest MiB; Seen needs a process in the cgroup and a usage above 0. Without isolation it is
// the sum of the RSS of the init's process tree (shared pages counted once per process). A
// sandbox still starting reads as not seen. Errors: ESandboxNotFound.
func (r *Runtime) Measure(id string) (Measurement, error) {
	r.mu.Lock()
	sb := r.sandboxes[id]
	r.mu.Unlock()
	if sb == nil {
		return Measurement{}, berth.Errorf(berth.ESandboxNotFound, "no sandbox %s on this host", id)
	}
	select {
	case <-sb.ready:
	default:
		return Measurement{}, nil
	}
	if sb.startErr != nil {
		return Measurement{}, berth.Errorf(berth.ESandboxNotFound, "sandbox %s failed to start", id)
	}
	m := Measurement{Exited: sb.hasExited()}
	if sb.cgroup == "" {
		var rss int64
		if !m.Exited { // once reaped, the pid may belong to a stranger
			for _, pid := range processTree("/proc", sb.proc.Pid) {
				rss += residentBytes("/proc", pid)
			}
		}
		m.ResidentMiB = workingSetMiB(rss, 0)
		m.Seen = rss > 0 && !m.Exited
		return m, nil
	}
	usage, inactive, err := cgroupUsage(sb.cgroup, r.cg.v2)
	if err != nil {
		return m, fmt.Errorf("process: measure %s: %w", id, err)
	}
	pids, err := cgroupProcs(sb.cgroup)
	if err != nil {
		return m, fmt.Errorf("process: measure %s: %w", id, err)
	}
	m.ResidentMiB = workingSetMiB(usage, inactive)
	m.Seen = len(pids) > 0 && usage > 0
	m.OOMKills = cgroupOOMKills(sb.cgroup, r.cg.v2)
	return m, nil
}

// cgroupOOMKills returns how many processes the kernel OOM killer killed in the cgroup:
// "oom_kill" of v1 memory.oom_control or v2 memory.events (C09). 0 when unreadable.
func cgroupOOMKills(dir string, v2 bool) int64 {
	file := "memory.oom_control"
	if v2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
