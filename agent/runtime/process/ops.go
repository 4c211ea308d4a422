package process

import (
	"context"
	"fmt"
	"net"

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

// client returns the host side of sb's init, over its unix socket.
func (r *Runtime) client(sb *sandbox) *sbinit.Client {
	return &sbinit.Client{
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sb.sock)
		},
		Gone:  func() bool { return sb.hasExited() || !r.sandboxes.Holds(sb.id, sb) },
		Label: "process: sandbox " + sb.id,
	}
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
	sb, ok := r.sandboxes.Peek(id)
	if !ok {
		return Measurement{}, berth.Errorf(berth.ESandboxNotFound, "no sandbox %s on this host", id)
	}
	if !sb.Ready() {
		return Measurement{}, nil // still starting (a failed start is gone from the registry)
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
