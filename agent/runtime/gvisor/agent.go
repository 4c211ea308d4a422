package gvisor

import (
	"context"
	"io"
	"net"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
)

// AgentRuntime adapts r to the agent's Runtime (ISO-4); it also offers agent.Services
// (APP-1) and agent.Checkpointer (PAUSE-1, SPOT-3). The driver depends on the agent's
// interface, never the reverse: whoever picks the runtime (cmd/berth) wires it.
func AgentRuntime(r *Runtime) agent.Runtime { return agentRuntime{r} }

type agentRuntime struct{ r *Runtime }

func (g agentRuntime) Start(ctx context.Context, s agent.Spec) error {
	return g.r.Start(ctx, specOf(s))
}
func (g agentRuntime) Stop(ctx context.Context, id string) error { return g.r.Stop(ctx, id) }
func (g agentRuntime) Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	return g.r.Exec(ctx, id, req)
}
func (g agentRuntime) WriteFile(ctx context.Context, id, path string, content io.Reader) error {
	return g.r.WriteFile(ctx, id, path, content)
}
func (g agentRuntime) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	return g.r.ReadFile(ctx, id, path)
}
func (g agentRuntime) Measure(id string) (agent.Measurement, error) {
	m, err := g.r.Measure(id)
	return agent.Measurement{ResidentMiB: m.ResidentMiB, Seen: m.Seen, Exited: m.Exited, OOMKills: m.OOMKills}, err
}
func (g agentRuntime) Serve(ctx context.Context, id string, req berth.ServiceRequest) error {
	return g.r.Serve(ctx, id, req)
}
func (g agentRuntime) ServiceStatus(ctx context.Context, id string) (berth.ServiceStatus, error) {
	return g.r.ServiceStatus(ctx, id)
}
func (g agentRuntime) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	return g.r.Dial(ctx, id, port)
}
func (g agentRuntime) Checkpoint(ctx context.Context, id, dir string) error {
	return g.r.Checkpoint(ctx, id, dir)
}
func (g agentRuntime) Restore(ctx context.Context, s agent.Spec, dir string) error {
	return g.r.Restore(ctx, specOf(s), dir)
}
func (g agentRuntime) Ping(ctx context.Context, id string) error { return g.r.Ping(ctx, id) }
func (g agentRuntime) Info() agent.RuntimeInfo {
	return agent.RuntimeInfo{Name: "gvisor", Platform: g.r.Platform(), Isolated: true}
}

func specOf(s agent.Spec) Spec {
	return Spec{ID: s.ID, Template: s.Template, MemoryMiB: s.MemoryMiB, VCPUs: s.VCPUs, VolumeDir: s.VolumeDir}
}

var (
	_ agent.Services     = agentRuntime{}
	_ agent.Checkpointer = agentRuntime{}
)
