package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/storetest"
)

// The create's one-trip reserve on PostgreSQL (issue 16): one pipeline that is its own
// implicit transaction. These tests hold rows and locks from another connection to put a
// create exactly where a race would be.

// oneTrip is a store on a fresh database, a second connection to it for the tests' own
// transactions, a third that watches pg_stat_activity (never in a transaction: a
// transaction keeps the first view of it it read), and agents a1 and a2 with admittable MiB
// each.
type oneTrip struct {
	url          string
	st           *Store
	other, watch *pgx.Conn
	now          time.Time
}

func newOneTrip(t *testing.T, admittable int64) *oneTrip {
	t.Helper()
	url := pgtest.Start(t).NewDatabase(t)
	o := &oneTrip{url: url, st: openURL(t, url), now: storetest.T0}
	for _, id := range []string{"a1", "a2"} {
		hb := berth.Heartbeat{AgentID: id, Status: berth.AgentActive, BootID: "b1", MemoryMiBTotal: 8192,
			MemoryMiBAdmittable: admittable, IntakeOpen: true, HeartbeatAt: o.now}
		if _, err := o.st.ApplyHeartbeat(t.Context(), hb, o.now); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []**pgx.Conn{&o.other, &o.watch} {
		conn, err := pgx.Connect(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		*c = conn
	}
	return o
}

// hold begins a transaction on the other connection and runs qs in it; it is rolled back when
// t ends unless the test commits it.
func (o *oneTrip) hold(t *testing.T, qs ...string) pgx.Tx {
	t.Helper()
	tx, err := o.other.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	for _, q := range qs {
		if _, err := tx.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return tx
}

// answer is what a create in a goroutine returned.
type answer struct {
	ok  bool
	err error
}

// create runs ReserveAndCreate of sandbox id (512 MiB) on agent for tenant in a goroutine.
func (o *oneTrip) create(ctx context.Context, id, agent, tenant, key string) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		r := berth.Reservation{ID: "r-" + id, AgentID: agent, SandboxID: id, MiB: 512, Owner: "replica-1", CreatedAt: o.now, ExpiresAt: o.now.Add(time.Minute)}
		sb := berth.Sandbox{ID: id, Tenant: tenant, AgentID: agent, State: berth.SandboxStarting, MemoryMiB: 512, IdempotencyKey: key}
		ok, err := o.st.ReserveAndCreate(ctx, r, sb, "tenant/"+tenant, o.now)
		done <- answer{ok, err}
	}()
	return done
}

// waitFor waits (bounded) until n backends of the database wait on a lock of the kind
// ("Lock" for rows and transactions, with event "advisory" for an advisory lock), failing t if
// early ends first: the waiter it watches answered without waiting.
func (o *oneTrip) waitFor(t *testing.T, n int, event string, early <-chan answer) {
	t.Helper()
	for range 1000 {
		select {
		case a := <-early:
			t.Fatalf("answered (%v, %v) before it waited on a lock", a.ok, a.err)
		default:
		}
		var got int
		q := `SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND ($1 = '' OR wait_event = $1)`
		if err := o.watch.QueryRow(t.Context(), q, event).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		time.Sleep(10 * time.Millisecond) // real: another PostgreSQL backend reaching its lock wait
	}
	t.Fatalf("fewer than %d backends ever waited on a lock (%q)", n, event)
}

// TestReserveAndCreateSumsAfterTheLock pins LED-1 for the one-trip path where a burst may
// not: another transaction holds the agent's row and adds a reservation that fills it; the
// create must wait for that row, then see the reservation committed while it waited and
// answer no room. A create that did not wait for the lock, or that summed with a snapshot
// taken before the lock was granted (one statement for lock and sum), would admit.
func TestReserveAndCreateSumsAfterTheLock(t *testing.T) {
	o := newOneTrip(t, 1024)
	ctx := t.Context()
	tx := o.hold(t, `SELECT 1 FROM agents WHERE id = 'a1' FOR UPDATE`,
		fmt.Sprintf(`INSERT INTO reservations (id, agent_id, sandbox_id, mib, owner, created_at, expires_at)
			VALUES ('r-other', 'a1', 'sb-other', 1024, 'replica-2', %d, %d)`, o.now.UnixMilli(), o.now.Add(time.Minute).UnixMilli()))
	done := o.create(ctx, "sb-1", "a1", "acme", "")
	o.waitFor(t, 1, "", done)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-done; a.err != nil || a.ok {
		t.Fatalf("ReserveAndCreate after a reservation filled the agent = %v, %v; want false, nil (LED-1)", a.ok, a.err)
	}
	if _, err := o.st.Sandbox(ctx, "sb-1"); !errors.Is(err, berth.ErrNotFound) {
		t.Errorf("Sandbox(sb-1) = %v; want not found: nothing is written without the room", err)
	}
}

// TestReserveAndCreateFinishesOnceSent: a create whose caller gives up while the pipeline
// waits for the agent's row still finishes, and says so. Its commit is implied by the
// pipeline, so a cancel could not undo it once sent; before this, the caller got "context
// canceled" and, when the lock came first, the rows committed anyway — an orphan `starting`
// row and a reservation nobody renews, events the log never saw.
func TestReserveAndCreateFinishesOnceSent(t *testing.T) {
	o := newOneTrip(t, 4096)
	var mu sync.Mutex
	var logged []string
	o.st.LogEvents(func(e berth.Event) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, e.Entity)
	})
	tx := o.hold(t, `SELECT 1 FROM agents WHERE id = 'a1' FOR UPDATE`)
	ctx, cancel := context.WithCancel(t.Context())
	done := o.create(ctx, "sb-1", "a1", "acme", "")
	o.waitFor(t, 1, "", done)
	cancel()
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || !a.ok {
		t.Fatalf("a create cancelled after its pipeline was sent = %v, %v; want it finished (true, nil)", a.ok, a.err)
	}
	if got, err := o.st.Sandbox(t.Context(), "sb-1"); err != nil || got.State != berth.SandboxStarting {
		t.Errorf("Sandbox(sb-1) = %+v, %v; want starting", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(logged) != 2 {
		t.Errorf("events logged: %q; want the reservation's and the sandbox's", logged)
	}
}

// TestReserveAndCreateBoundsItsLockWait: once sent, a pipeline is bounded by PostgreSQL's
// lock_timeout (set for its own transaction), not by the caller: a create whose agent's row
// stays locked fails with a transient error (a 503 with Retry-After at the API) and writes
// nothing.
func TestReserveAndCreateBoundsItsLockWait(t *testing.T) {
	defer func(d string) { poolBatchLockTimeout = d }(poolBatchLockTimeout)
	poolBatchLockTimeout = "200ms"
	o := newOneTrip(t, 4096)
	o.hold(t, `SELECT 1 FROM agents WHERE id = 'a1' FOR UPDATE`)
	done := o.create(t.Context(), "sb-1", "a1", "acme", "")
	select {
	case a := <-done:
		if a.err == nil || !berth.Transient(a.err) {
			t.Fatalf("a create on a row held for good = %v, %v; want a transient error (lock timeout)", a.ok, a.err)
		}
	case <-time.After(20 * time.Second): // real: PostgreSQL's lock_timeout, on the server's clock
		t.Fatal("the create still waits for the row: the pipeline's lock_timeout was not applied")
	}
	if _, err := o.st.Sandbox(t.Context(), "sb-1"); !errors.Is(err, berth.ErrNotFound) {
		t.Errorf("Sandbox(sb-1) = %v; want not found", err)
	}
}

// TestQuotaSetWhileACreateDecides pins ADM-11 across a quota being set: create A (tenant
// without a quota) waits inside its deciding statement — on another transaction's row holding
// the same Idempotency-Key — when SetQuota(MaxSandboxes 1) comes; the other transaction then
// rolls back, A commits, and a create B after SetQuota must be refused. SetQuota used to
// return at once (a tenant without a quota has no row to lock), and B, counting usage without
// A, was admitted: 2 live sandboxes under a limit of 1. Found by an attack.
func TestQuotaSetWhileACreateDecides(t *testing.T) {
	o := newOneTrip(t, 4096)
	ctx := t.Context()
	if _, err := o.st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: o.now}); err != nil {
		t.Fatal(err)
	}
	tx := o.hold(t, fmt.Sprintf(`INSERT INTO sandboxes (id, tenant, agent_id, state, created_at, idempotency_key)
		VALUES ('sb-other', 'acme', 'a1', 'starting', %d, 'k')`, o.now.UnixMilli()))
	doneA := o.create(ctx, "sb-a", "a1", "acme", "k")
	o.waitFor(t, 1, "", doneA)
	set := make(chan error, 1)
	go func() { set <- o.st.SetQuota(ctx, berth.Quota{Tenant: "acme", MaxSandboxes: 1}, "test", o.now) }()
	// SetQuota either waits for A (on the tenant's quota lock) or returns before it.
	var setErr error
	setDone := false
	for range 1000 {
		select {
		case setErr = <-set:
			setDone = true
		default:
		}
		var n int
		if err := o.watch.QueryRow(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'advisory'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if setDone || n > 0 {
			break
		}

		time.Sleep(10 * time.Millisecond) // real: SetQuota's backend reaching its lock wait
	}
	var b answer
	createB := func() {
		b = <-o.create(ctx, "sb-b", "a2", "acme", "")
	}
	if setDone { // SetQuota did not wait for A: B now is what the race allowed
		createB()
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-doneA; a.err != nil || !a.ok {
		t.Fatalf("create A = %v, %v; want true, nil", a.ok, a.err)
	}
	if !setDone {
		setErr = <-set
		createB()
	}
	if setErr != nil {
		t.Fatal(setErr)
	}
	live, err := o.st.Sandboxes(ctx, berth.SandboxFilter{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 1 || b.ok || !errors.Is(b.err, berth.ErrOverQuota) {
		t.Errorf("after SetQuota(MaxSandboxes 1): %d live sandboxes, create B = %v, %v; want 1, and B refused over quota (ADM-11)", len(live), b.ok, b.err)
	}
}
