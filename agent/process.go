package agent

import (
	"context"
	"io"
	"net"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/process"
)

// ProcessRuntime adapts the process runtime driver (AGT-3) to the agent's Runtime; it also
// offers Services (APP-1).
func ProcessRuntime(r *process.Runtime) Runtime { return processRuntime{r} }

type processRuntime struct{ r *process.Runtime }

func (p processRuntime) Start(ctx context.Context, s Spec) error {
	return p.r.Start(ctx, process.Spec{ID: s.ID, Template: s.Template, MemoryMiB: s.MemoryMiB, VCPUs: s.VCPUs, VolumeDir: s.VolumeDir})
}
func (p processRuntime) Stop(ctx context.Context, id string) error { return p.r.Stop(ctx, id) }
func (p processRuntime) Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	return p.r.Exec(ctx, id, req)
}
func (p processRuntime) WriteFile(ctx context.Context, id, path string, content io.Reader) error {
	return p.r.WriteFile(ctx, id, path, content)
}
func (p processRuntime) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	return p.r.ReadFile(ctx, id, path)
}
func (p processRuntime) Measure(id string) (Measurement, error) {
	m, err := p.r.Measure(id)
	return Measurement{ResidentMiB: m.ResidentMiB, Seen: m.Seen, Exited: m.Exited, OOMKills: m.OOMKills}, err
}
func (p processRuntime) Serve(ctx context.Context, id string, req berth.ServiceRequest) error {
	return p.r.Serve(ctx, id, req)
}
func (p processRuntime) ServiceStatus(ctx context.Context, id string) (berth.ServiceStatus, error) {
	return p.r.ServiceStatus(ctx, id)
}
func (p processRuntime) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	return p.r.Dial(ctx, id, port)
}

func (p processRuntime) Info() RuntimeInfo {
	return RuntimeInfo{Name: "process", Isolated: p.r.Isolated()}
}

var _ Services = processRuntime{}
