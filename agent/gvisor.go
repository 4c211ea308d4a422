package agent

import (
	"context"
	"io"
	"net"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/gvisor"
)

// GVisorRuntime adapts the gVisor runtime driver (ISO-4) to the agent's Runtime; it also
// offers Services (APP-1) and Checkpointer (PAUSE-1, SPOT-3).
func GVisorRuntime(r *gvisor.Runtime) Runtime { return gvisorRuntime{r} }

type gvisorRuntime struct{ r *gvisor.Runtime }

func (g gvisorRuntime) Start(ctx context.Context, s Spec) error   { return g.r.Start(ctx, gvisorSpec(s)) }
func (g gvisorRuntime) Stop(ctx context.Context, id string) error { return g.r.Stop(ctx, id) }
func (g gvisorRuntime) Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	return g.r.Exec(ctx, id, req)
}
func (g gvisorRuntime) WriteFile(ctx context.Context, id, path string, content io.Reader) error {
	return g.r.WriteFile(ctx, id, path, content)
}
func (g gvisorRuntime) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	return g.r.ReadFile(ctx, id, path)
}
func (g gvisorRuntime) Measure(id string) (Measurement, error) {
	m, err := g.r.Measure(id)
	return Measurement{ResidentMiB: m.ResidentMiB, Seen: m.Seen, Exited: m.Exited, OOMKills: m.OOMKills}, err
}
func (g gvisorRuntime) Serve(ctx context.Context, id string, req berth.ServiceRequest) error {
	return g.r.Serve(ctx, id, req)
}
func (g gvisorRuntime) ServiceStatus(ctx context.Context, id string) (berth.ServiceStatus, error) {
	return g.r.ServiceStatus(ctx, id)
}
func (g gvisorRuntime) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	return g.r.Dial(ctx, id, port)
}
func (g gvisorRuntime) Checkpoint(ctx context.Context, id, dir string) error {
	return g.r.Checkpoint(ctx, id, dir)
}
func (g gvisorRuntime) Restore(ctx context.Context, s Spec, dir string) error {
	return g.r.Restore(ctx, gvisorSpec(s), dir)
}
func (g gvisorRuntime) Ping(ctx context.Context, id string) error { return g.r.Ping(ctx, id) }
func (g gvisorRuntime) Info() RuntimeInfo {
	return RuntimeInfo{Name: "gvisor", Platform: g.r.Platform(), Isolated: true}
}

func gvisorSpec(s Spec) gvisor.Spec {
	return gvisor.Spec{ID: s.ID, Template: s.Template, MemoryMiB: s.MemoryMiB, VCPUs: s.VCPUs, VolumeDir: s.VolumeDir}
}

var (
	_ Services     = gvisorRuntime{}
	_ Checkpointer = gvisorRuntime{}
)
