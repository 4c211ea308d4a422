package process

import (
	"context"
	"io"
	"net"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
)

// AgentRuntime adapts r to the agent's Runtime (AGT-3); it also offers agent.Services
// (APP-1). The driver depends on the agent's interface, never the reverse: whoever picks the
// runtime (cmd/berth) wires it.
func AgentRuntime(r *Runtime) agent.Runtime { return agentRuntime{r} }

type agentRuntime struct{ r *Runtime }

func (p agentRuntime) Start(ctx context.Context, s agent.Spec) error {
	return p.r.Start(ctx, Spec{ID: s.ID, Template: s.Template, MemoryMiB: s.MemoryMiB, VCPUs: s.VCPUs, VolumeDir: s.VolumeDir})
}
func (p agentRuntime) Stop(ctx context.Context, id string) error { return p.r.Stop(ctx, id) }
func (p agentRuntime) Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	return p.r.Exec(ctx, id, req)
}
func (p agentRuntime) WriteFile(ctx context.Context, id, path string, content io.Reader) error {
	return p.r.WriteFile(ctx, id, path, content)
}
func (p agentRuntime) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	return p.r.ReadFile(ctx, id, path)
}
func (p agentRuntime) Measure(id string) (agent.Measurement, error) {
	m, err := p.r.Measure(id)
	return agent.Measurement{ResidentMiB: m.ResidentMiB, Seen: m.Seen, Exited: m.Exited, OOMKills: m.OOMKills}, err
}
func (p agentRuntime) Serve(ctx context.Context, id string, req berth.ServiceRequest) error {
	return p.r.Serve(ctx, id, req)
}
func (p agentRuntime) ServiceStatus(ctx context.Context, id string) (berth.ServiceStatus, error) {
	return p.r.ServiceStatus(ctx, id)
}
func (p agentRuntime) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	return p.r.Dial(ctx, id, port)
}

func (p agentRuntime) Info() agent.RuntimeInfo {
	return agent.RuntimeInfo{Name: "process", Isolated: p.r.Isolated()}
}

var _ agent.Services = agentRuntime{}
