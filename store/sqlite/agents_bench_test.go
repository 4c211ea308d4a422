package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// BenchmarkAgents reads the whole agent table as the scheduler's refresh does, for 2,000
// agents holding 10 sandboxes each (issue 16, goal 2: the held lists come from agent_held
// now, not from a JSON column per agent). It compiles against the tree before issue 16 too.
//
//	go test ./store/sqlite -run '^$' -bench BenchmarkAgents -benchtime 50x
func BenchmarkAgents(b *testing.B) {
	ctx := context.Background()
	st, err := Open(ctx, filepath.Join(b.TempDir(), "berth.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	const agents, held = 2000, 10
	for i := range agents {
		hb := berth.Heartbeat{AgentID: fmt.Sprintf("a%05d", i), Address: "http://127.0.0.1:1", Status: berth.AgentActive,
			MemoryAdmission: berth.AdmissionCommitted, BootID: "b1", Seq: 1}
		for j := range held {
			hb.Sandboxes = append(hb.Sandboxes, berth.HeldSandbox{ID: fmt.Sprintf("a%05d-%d", i, j), ResidentMiB: 100, Measured: true})
		}
		if _, err := st.ApplyHeartbeat(ctx, hb, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		as, err := st.Agents(ctx)
		if err != nil || len(as) != agents || len(as[agents-1].Sandboxes) != held {
			b.Fatalf("Agents: %d, %v", len(as), err)
		}
	}
}
