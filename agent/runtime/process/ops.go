package process

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/cgroups"
	"github.com/berth-dev/berth/agent/runtime/sbinit"
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

// client returns the host side of sb's init, over its unix socket.
func (r *Runtime) client(sb *sandbox) *sbinit.Client {
	return &sbinit.Client{
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sb.sock)
		},
		Gone:  func() bool { return sb.hasExited() || !r.holds(sb) },
		Label: "process: sandbox " + sb.id,
	}
}

// Exec runs req.Cmd inside the sandbox — with isolation as its uid, cwd and HOME /tmp; without,
// in its working directory — with PATH /usr/local/bin:/usr/bin:/bin, then the agent's PATH
// directories (with isolation, those that exist in its root); see sbinit.Client.Exec for the
// contract.
func (r *Runtime) Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return berth.ExecResult{}, err
	}
	return r.client(sb).Exec(ctx, req)
}

// WriteFile streams content into path as the sandbox sees it (ISO-3: with isolation resolved
// in its own root and written as its uid; without, only /tmp paths, in its working
// directory); see sbinit.Client.WriteFile.
func (r *Runtime) WriteFile(ctx context.Context, id, path string, content io.Reader) error {
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return err
	}
	return r.client(sb).WriteFile(ctx, path, content)
}

// ReadFile streams the content of path as the sandbox sees it; see sbinit.Client.ReadFile.
func (r *Runtime) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	return r.client(sb).ReadFile(ctx, path)
}

// Ping checks that the sandbox's init answers.
func (r *Runtime) Ping(ctx context.Context, id string) error {
	sb, err := r.lookup(ctx, id)
	if err != nil {
		return err
	}
	return r.client(sb).Ping(ctx)
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
		m.ResidentMiB = cgroups.WorkingSetMiB(rss, 0)
		m.Seen = rss > 0 && !m.Exited
		return m, nil
	}
	usage, inactive, err := cgroups.Usage(sb.cgroup, r.memory.v2)
	if err != nil {
		return m, fmt.Errorf("process: measure %s: %w", id, err)
	}
	pids, err := cgroups.Procs(sb.cgroup)
	if err != nil {
		return m, fmt.Errorf("process: measure %s: %w", id, err)
	}
	m.ResidentMiB = cgroups.WorkingSetMiB(usage, inactive)
	m.Seen = len(pids) > 0 && usage > 0
	m.OOMKills = cgroups.OOMKills(sb.cgroup, r.memory.v2)
	return m, nil
}
