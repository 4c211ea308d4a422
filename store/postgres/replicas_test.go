package postgres

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/storetest"
)

// replicas opens n Stores over one fresh database: n server replicas, each with its own pool.
func replicas(t *testing.T, n int) []*Store {
	t.Helper()
	url := pgtest.Start(t).NewDatabase(t)
	out := make([]*Store, n)
	for i := range out {
		out[i] = openURL(t, url)
	}
	return out
}

// TestBurstAcrossReplicasNeverOverAdmits is the LED-1 burst of issue 3 at the store level: 4
// replicas, one agent with room for exactly n reserves of 512 MiB, 40 concurrent reserves spread
// round-robin over the replicas, 20 rounds: every round admits exactly n, and after releasing
// them the ledger is empty. It runs for Reserve and for ReserveAndCreate, whose one-trip path
// (issue 16) decides in SQL.
func TestBurstAcrossReplicasNeverOverAdmits(t *testing.T) {
	for _, withRow := range []bool{false, true} {
		name := map[bool]string{false: "Reserve", true: "ReserveAndCreate"}[withRow]
		t.Run(name, func(t *testing.T) { burstAcrossReplicas(t, withRow) })
	}
}

func burstAcrossReplicas(t *testing.T, withRow bool) {
	const (
		nReplicas = 4
		burst     = 40
		rounds    = 20
		mib       = 512
	)
	rs := replicas(t, nReplicas)
	ctx := t.Context()
	now := storetest.T0
	for round := range rounds {
		n := 1 + round%7 // 1…7 reserves fit
		hb := berth.Heartbeat{AgentID: "a1", Status: berth.AgentActive, BootID: "b1", MemoryMiBTotal: 8192,
			MemoryMiBAdmittable: int64(n * mib), IntakeOpen: true, HeartbeatAt: now}
		if _, err := rs[round%nReplicas].ApplyHeartbeat(ctx, hb, now); err != nil {
			t.Fatalf("round %d: heartbeat: %v", round, err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		took := make([]bool, burst)
		errs := make([]error, burst)
		for i := range burst {
			wg.Go(func() {
				r := berth.Reservation{
					ID: fmt.Sprintf("r%02d-%02d", round, i), AgentID: "a1", SandboxID: fmt.Sprintf("sb%02d-%02d", round, i),
					MiB: mib, Owner: fmt.Sprintf("replica-%d", i%nReplicas), CreatedAt: now, ExpiresAt: now.Add(time.Minute),
				}
				<-start
				if !withRow {
					took[i], errs[i] = rs[i%nReplicas].Reserve(ctx, r, now)
					return
				}
				sb := berth.Sandbox{ID: r.SandboxID, Tenant: "acme", AgentID: "a1", State: berth.SandboxStarting, MemoryMiB: mib}
				took[i], errs[i] = rs[i%nReplicas].ReserveAndCreate(ctx, r, sb, "tenant/acme", now)
			})
		}
		close(start)
		wg.Wait()
		var taken []string
		for i := range burst {
			if errs[i] != nil {
				t.Errorf("round %d: reserve #%d: %v", round, i, errs[i])
			}
			if took[i] {
				taken = append(taken, fmt.Sprintf("r%02d-%02d", round, i))
			}
		}
		if len(taken) != n {
			t.Errorf("round %d: %d of %d reserves admitted against room for %d, want exactly %d", round, len(taken), burst, n, n)
		}
		pending, err := rs[(round+1)%nReplicas].Pending(ctx, now)
		if err != nil {
			t.Fatalf("round %d: Pending: %v", round, err)
		}
		if diff := cmp.Diff(map[string]int64{"a1": int64(len(taken) * mib)}, pending); diff != "" {
			t.Errorf("round %d: Pending (-want +got):\n%s", round, diff)
		}
		for i, id := range taken {
			if ok, err := rs[i%nReplicas].Release(ctx, id); err != nil || !ok {
				t.Errorf("round %d: Release(%s) = %v, %v; want true, nil", round, id, ok, err)
			}
		}
		now = now.Add(time.Second)
	}
	pending, err := rs[0].Pending(ctx, now)
	if err != nil || len(pending) != 0 {
		t.Errorf("after the rounds: Pending = %v, %v; want empty", pending, err)
	}
	left, err := rs[1].Reservations(ctx)
	if err != nil || len(left) != 0 {
		t.Errorf("after the rounds: %d reservations left (%v), want 0", len(left), err)
	}
}

// TestIdempotentCreateAcrossReplicas pins API-4 across replicas: of concurrent creates with one
// key on different replicas exactly one is stored, and every replica finds it by the key.
func TestIdempotentCreateAcrossReplicas(t *testing.T) {
	rs := replicas(t, 4)
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make([]error, 12)
	for i := range errs {
		wg.Go(func() {
			sb := berth.Sandbox{ID: fmt.Sprintf("sb-%02d", i), Tenant: "acme", AgentID: "a1",
				State: berth.SandboxStarting, IdempotencyKey: "k1", CreatedAt: storetest.T0}
			errs[i] = rs[i%len(rs)].CreateSandbox(ctx, sb, "test", storetest.T0)
		})
	}
	wg.Wait()
	winner := ""
	for i, err := range errs {
		switch {
		case err == nil && winner == "":
			winner = fmt.Sprintf("sb-%02d", i)
		case err == nil:
			t.Errorf("create sb-%02d also succeeded (after %s)", i, winner)
		default:
			if !errors.Is(err, berth.ErrIdempotencyConflict) {
				t.Errorf("create sb-%02d: %v, want ErrIdempotencyConflict", i, err)
			}
		}
	}
	for i, s := range rs {
		got, err := s.SandboxByIdempotencyKey(ctx, "acme", "k1")
		if err != nil || got.ID != winner {
			t.Errorf("replica %d: SandboxByIdempotencyKey = %q, %v; want %q", i, got.ID, err, winner)
		}
	}
}

// TestDrainReachesOtherReplicas pins PLC-5 across replicas: a drain or undrain written through
// replica A is pushed to a WatchAgents running on replica B.
func TestDrainReachesOtherReplicas(t *testing.T) {
	rs := replicas(t, 2)
	a, b := rs[0], rs[1]
	ctx := t.Context()
	hb := berth.Heartbeat{AgentID: "a1", Status: berth.AgentActive, BootID: "b1", MemoryMiBAdmittable: 1024}
	if _, err := a.ApplyHeartbeat(ctx, hb, storetest.T0); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	w := storetest.Watch(t, b)
	for i, on := range []bool{true, false, true} {
		if err := a.SetAgentDrain(ctx, "a1", on, "ops", "admin/ops", storetest.T0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatalf("SetAgentDrain(%v) on A: %v", on, err)
		}
		w.Next("a1")
		got, err := b.Agent(ctx, "a1")
		if err != nil || (got.Status == berth.AgentDraining) != on {
			t.Errorf("after drain=%v on A, B reads status %s (%v)", on, got.Status, err)
		}
	}
}
