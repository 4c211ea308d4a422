package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

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

// TestReserveAndCreateSumsAfterTheLock pins LED-1 for ReserveAndCreate's one-trip path (issue
// 16) where a burst may not: another transaction holds the agent's row and adds a reservation
// that fills it; the create must wait for that row, then see the reservation committed while
// it waited and answer no room. A create that did not wait for the lock, or that summed with
// a snapshot taken before the lock was granted (one statement for lock and sum), would admit.
func TestReserveAndCreateSumsAfterTheLock(t *testing.T) {
	url := pgtest.Start(t).NewDatabase(t)
	st := openURL(t, url)
	ctx := t.Context()
	now := storetest.T0
	hb := berth.Heartbeat{AgentID: "a1", Status: berth.AgentActive, BootID: "b1", MemoryMiBTotal: 8192,
		MemoryMiBAdmittable: 1024, IntakeOpen: true, HeartbeatAt: now}
	if _, err := st.ApplyHeartbeat(ctx, hb, now); err != nil {
		t.Fatal(err)
	}
	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.WithoutCancel(ctx))
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	for _, q := range []string{
		`SELECT 1 FROM agents WHERE id = 'a1' FOR UPDATE`,
		fmt.Sprintf(`INSERT INTO reservations (id, agent_id, sandbox_id, mib, owner, created_at, expires_at)
			VALUES ('r-other', 'a1', 'sb-other', 1024, 'replica-2', %d, %d)`, now.UnixMilli(), now.Add(time.Minute).UnixMilli()),
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	type answer struct {
		ok  bool
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r := berth.Reservation{ID: "r1", AgentID: "a1", SandboxID: "sb-1", MiB: 512, Owner: "replica-1", CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
		sb := berth.Sandbox{ID: "sb-1", Tenant: "acme", AgentID: "a1", State: berth.SandboxStarting, MemoryMiB: 512}
		ok, err := st.ReserveAndCreate(ctx, r, sb, "tenant/acme", now)
		done <- answer{ok, err}
	}()
	// Wait (bounded) until the create's backend waits on a lock, then commit the other
	// transaction.
	waiting := false
	for range 1000 {
		select {
		case a := <-done:
			t.Fatalf("ReserveAndCreate answered (%v, %v) while another transaction held the agent's row: it did not wait for the lock", a.ok, a.err)
		default:
		}
		var n int
		if err := other.QueryRow(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if waiting = n > 0; waiting {
			break
		}
		time.Sleep(10 * time.Millisecond) // real: another PostgreSQL backend reaching its lock wait
	}
	if !waiting {
		t.Fatal("the create never waited on the agent's row lock")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || a.ok {
		t.Fatalf("ReserveAndCreate after a reservation filled the agent = %v, %v; want false, nil (LED-1)", a.ok, a.err)
	}
	if _, err := st.Sandbox(ctx, "sb-1"); !errors.Is(err, berth.ErrNotFound) {
		t.Errorf("Sandbox(sb-1) = %v; want not found: nothing is written without the room", err)
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
