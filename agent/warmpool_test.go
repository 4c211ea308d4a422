package agent

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// warmTestAgent is an agent on the fake runtime with a warm pool of shell=size:256, filled
// by one refill round.
func warmTestAgent(t *testing.T, mode string, memMiB int64, size int, rt *fakeRuntime) *Agent {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ID, cfg.Admission, cfg.MemoryMiB, cfg.HeadroomMiB = "a1", mode, memMiB, 0
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.PressureSource = func() (float64, bool) { return 0, true }
	cfg.WarmPool = []WarmPoolEntry{{Template: "shell", MemoryMiB: 256, Size: size}}
	a, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.ln.Close() })
	a.warmRound(context.Background(), time.Now())
	return a
}

func warmIDs(a *Agent) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for id := range a.warm.guests {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// TestWarmPool_ReleasedFirstUnderPressure (ADM-9, issue 16 goal 5): the pool's working set
// counts in the host's reading, and at the first critical reading the pool is stopped
// whole while no tenant's sandbox is touched; once that brings the host back over its floor,
// nothing is evicted.
func TestWarmPool_ReleasedFirstUnderPressure(t *testing.T) {
	rt := &fakeRuntime{resident: map[string]int64{"t1": 1500}, seen: true}
	a := warmTestAgent(t, berth.AdmissionNone, 2048, 2, rt)
	a.cfg.EvictFloorMiB = 400
	warm := warmIDs(a)
	if len(warm) != 2 {
		t.Fatalf("pool %v after a refill round, want 2 guests", warm)
	}
	if err := a.Create(context.Background(), berth.AgentCreate{ID: "t1", Template: "python", MemoryMiB: 1024, TTLMS: 3_600_000}); err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	for _, id := range warm {
		rt.resident[id] = 200 // 1500 + 2 × 200: 148 MiB available, under the 400 MiB floor
	}
	rt.mu.Unlock()
	a.measureWarm(context.Background())

	t0 := time.Now()
	a.measureOnce(context.Background(), t0)
	if got := warmIDs(a); len(got) != 0 {
		t.Fatalf("pool %v after a critical reading, want it released", got)
	}
	rt.mu.Lock()
	stopped := slices.Clone(rt.stopped)
	rt.mu.Unlock()
	slices.Sort(stopped)
	if !slices.Equal(stopped, warm) {
		t.Fatalf("stopped %v, want exactly the warm guests %v", stopped, warm)
	}
	a.measureOnce(context.Background(), t0.Add(time.Second)) // 548 MiB available: calm
	if hb := a.Heartbeat(t0.Add(time.Second)); len(hb.Ended) != 0 || len(hb.Sandboxes) != 1 {
		t.Fatalf("ended %+v, held %+v: want t1 kept (the pool went instead)", hb.Ended, hb.Sandboxes)
	}
	a.warmRound(context.Background(), t0.Add(time.Second))
	if got := warmIDs(a); len(got) != 2 {
		t.Fatalf("pool %v once calm, want it refilled to 2", got)
	}
}

// TestWarmPool_ReleasedWhenIntakeCloses: a draining host (AGT-5) or a closed pressure gate
// (ADM-8) keeps no warm guests and starts none.
func TestWarmPool_ReleasedWhenIntakeCloses(t *testing.T) {
	rt := &fakeRuntime{}
	a := warmTestAgent(t, berth.AdmissionCommitted, 4096, 2, rt)
	if got := warmIDs(a); len(got) != 2 {
		t.Fatalf("pool %v, want 2", got)
	}
	a.Drain("test")
	a.warmRound(context.Background(), time.Now())
	a.warmRound(context.Background(), time.Now())
	if got := warmIDs(a); len(got) != 0 {
		t.Fatalf("pool %v while draining, want empty", got)
	}
	a.Undrain()
	a.warmRound(context.Background(), time.Now())
	if got := warmIDs(a); len(got) != 2 {
		t.Fatalf("pool %v after undrain, want refilled to 2", got)
	}
}

// TestWarmPool_RefillTakesNoCreateSlot (ADM-10): a refill never holds one of the creates'
// start slots — every slot stays free for creates while a warm guest starts — and it waits
// while creates use half of their slots or more.
func TestWarmPool_RefillTakesNoCreateSlot(t *testing.T) {
	var a *Agent
	slotsDuringStart := -1
	rt := &fakeRuntime{start: func(id string) error {
		slotsDuringStart = len(a.starts)
		return nil
	}}
	cfg := DefaultConfig()
	cfg.ID, cfg.MemoryMiB, cfg.HeadroomMiB, cfg.MaxStarts = "a1", 4096, 0, 2
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.PressureSource = func() (float64, bool) { return 0, true }
	cfg.WarmPool = []WarmPoolEntry{{Template: "shell", MemoryMiB: 256, Size: 1}}
	a, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.ln.Close() })
	a.starts <- struct{}{} // a create is starting: half of the creates' slots in use
	a.warmRound(context.Background(), time.Now())
	if got := warmIDs(a); len(got) != 0 {
		t.Fatalf("pool %v started while creates used half of their slots, want nothing started", got)
	}
	<-a.starts
	a.warmRound(context.Background(), time.Now())
	if got := warmIDs(a); len(got) != 1 {
		t.Fatalf("pool %v with the creates' slots free, want 1", got)
	}
	if slotsDuringStart != 0 {
		t.Fatalf("%d of the creates' start slots held while the warm guest started, want 0", slotsDuringStart)
	}
}

// TestWarmPool_BadConfigAndIDs: New refuses a pool it cannot keep, and a create may not use
// the pool's own id prefix (invalid_request, never a panic).
func TestWarmPool_BadConfigAndIDs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pool      []WarmPoolEntry
		maxStarts int
	}{
		{"no template", []WarmPoolEntry{{MemoryMiB: 256, Size: 1}}, 8},
		{"twice", []WarmPoolEntry{{"shell", 256, 1}, {"shell", 512, 1}}, 8},
		{"no memory", []WarmPoolEntry{{"shell", 0, 1}}, 8},
		{"negative size", []WarmPoolEntry{{"shell", 256, -1}}, 8},
		{"huge", []WarmPoolEntry{{"shell", 256, 65}}, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MemoryMiB, cfg.WarmPool, cfg.MaxStarts = 4096, tc.pool, tc.maxStarts
			a, err := New(cfg, &fakeRuntime{})
			if err == nil {
				a.ln.Close()
			}
			if berth.ErrorCode(err) != berth.EInvalidRequest {
				t.Fatalf("New = %v, want invalid_request", err)
			}
		})
	}
	a := warmTestAgent(t, berth.AdmissionCommitted, 4096, 1, &fakeRuntime{})
	err := a.Create(context.Background(), berth.AgentCreate{ID: warmIDPrefix + "x", Template: "shell", MemoryMiB: 256})
	if berth.ErrorCode(err) != berth.EInvalidRequest {
		t.Fatalf("create with the pool's prefix = %v, want invalid_request", err)
	}
}
