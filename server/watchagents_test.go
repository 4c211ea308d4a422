package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/store/sqlite"
)

// gatedAgentReads counts the store's single-agent reads and holds the first until gate is
// closed, so the changes pushed meanwhile queue up behind it.
type gatedAgentReads struct {
	berth.Store
	n    atomic.Int64
	gate chan struct{}
}

func (g *gatedAgentReads) Agent(ctx context.Context, id string) (berth.Agent, error) {
	if g.n.Add(1) == 1 {
		<-g.gate
	}
	return g.Store.Agent(ctx, id)
}

// TestPLC5_BurstOfAgentChangesIsOneRefresh (issue 16, goal 2): changes pushed to a replica
// one at a time are each read alone (PLC-5), but a burst of them — here 200 agents
// registering while the replica is busy with the first — is folded in by one refresh of what
// changed, not a read per agent; every one of them is in the snapshot after. Real SQLite and
// its in-process change notifications.
func TestPLC5_BurstOfAgentChangesIsOneRefresh(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "berth.db"))
	must(t, err)
	t.Cleanup(func() { st.Close() })
	reads := &gatedAgentReads{Store: st, gate: make(chan struct{})}
	cfg := DefaultConfig()
	cfg.Logger, cfg.CacheTTL = slog.New(slog.NewTextHandler(io.Discard, nil)), time.Hour
	s := New(cfg, reads)
	must(t, s.sched.refresh(ctx))
	watching := make(chan struct{})
	go s.watchAgents(ctx, watcherReady{st, watching})
	<-watching
	beat := func(id string) {
		t.Helper()
		_, err := st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: id, Address: "http://127.0.0.1:1", Status: berth.AgentActive,
			IntakeOpen: true, MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096,
			CPUTotal: 2, BootID: "b1", Seq: 1}, time.Now())
		must(t, err)
	}
	beat("first") // its read is held at the gate
	waitUntil(t, "the first change to be read", func() (bool, string) {
		return reads.n.Load() == 1, fmt.Sprintf("%d reads", reads.n.Load())
	})
	const burst = 200
	for i := range burst {
		beat(fmt.Sprintf("burst-%03d", i))
	}
	close(reads.gate)
	waitUntil(t, "every agent of the burst in the snapshot", func() (bool, string) {
		for i := range burst {
			if _, ok := s.sched.address(fmt.Sprintf("burst-%03d", i)); !ok {
				return false, fmt.Sprintf("burst-%03d missing", i)
			}
		}
		return true, ""
	})
	if n := reads.n.Load(); n > 2 {
		t.Errorf("a burst of %d pushed changes cost %d single-agent reads, want the first one and a refresh", burst, n)
	}
	// A lone change afterwards (a drain) is read alone.
	before := reads.n.Load()
	must(t, st.SetAgentDrain(ctx, "burst-007", true, "maintenance", "admin/ops", time.Now()))
	waitUntil(t, "the lone change to be read", func() (bool, string) {
		return reads.n.Load() == before+1, fmt.Sprintf("%d reads since", reads.n.Load()-before)
	})
}

// watcherReady is an AgentWatcher that closes ready once its watch is established (the
// watcher's first call, with "").
type watcherReady struct {
	w     berth.AgentWatcher
	ready chan struct{}
}

func (r watcherReady) WatchAgents(ctx context.Context, fn func(id string)) error {
	var once atomic.Bool
	return r.w.WatchAgents(ctx, func(id string) {
		fn(id)
		if id == "" && once.CompareAndSwap(false, true) {
			close(r.ready)
		}
	})
}
