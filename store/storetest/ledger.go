package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

// testReserve pins the fits check of LED-1/ADM-7: admittable − Σ unexpired ≥ MiB.
func testReserve(t *testing.T, open func(t *testing.T) berth.Store) {
	earlier := at(-time.Minute)
	held := func(id string, mib int64, expires time.Time) berth.Reservation {
		r := reservation(id, "a1", "sb-"+id, mib, earlier)
		r.ExpiresAt = expires
		return r
	}
	live := at(time.Minute)
	tests := []struct {
		name     string
		existing []berth.Reservation
		try      berth.Reservation
		want     bool
	}{
		{"fits an empty agent", nil, reservation("new", "a1", "sb", 2048, T0), true},
		{"exact fit", []berth.Reservation{held("h1", 1024, live)}, reservation("new", "a1", "sb", 1024, T0), true},
		{"over by one MiB", []berth.Reservation{held("h1", 1024, live)}, reservation("new", "a1", "sb", 1025, T0), false},
		{"sum of several", []berth.Reservation{held("h1", 1000, live), held("h2", 1000, live)}, reservation("new", "a1", "sb", 49, T0), false},
		{"expired at now does not count", []berth.Reservation{held("h1", 2048, T0)}, reservation("new", "a1", "sb", 2048, T0), true},
		{"unexpired by 1 ms counts", []berth.Reservation{held("h1", 2048, at(time.Millisecond))}, reservation("new", "a1", "sb", 1, T0), false},
		{"other agents do not count", []berth.Reservation{{ID: "h1", AgentID: "a2", MiB: 2048, ExpiresAt: live}}, reservation("new", "a1", "sb", 2048, T0), true},
		{"zero MiB fits a full agent", []berth.Reservation{held("h1", 2048, live)}, reservation("new", "a1", "sb", 0, T0), true},
		{"unknown agent", nil, reservation("new", "ghost", "sb", 0, T0), false},
		{"too big for the agent", nil, reservation("new", "a1", "sb", 2049, T0), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			ctx := t.Context()
			mustHeartbeat(t, s, heartbeat("a1", 2048), earlier)
			mustHeartbeat(t, s, heartbeat("a2", 2048), earlier)
			for _, r := range tc.existing {
				mustReserve(t, s, r, earlier)
			}
			got, err := s.Reserve(ctx, tc.try, T0)
			if err != nil || got != tc.want {
				t.Fatalf("Reserve(%d MiB) = %v, %v; want %v, nil", tc.try.MiB, got, err, tc.want)
			}
			wantNew := 0
			if tc.want {
				wantNew = 1
			}
			rs, err := s.Reservations(ctx)
			if err != nil {
				t.Fatalf("Reservations: %v", err)
			}
			if n := len(rs) - len(tc.existing); n != wantNew {
				t.Errorf("ledger grew by %d rows, want %d", n, wantNew)
			}
			if n := len(events(t, s, berth.EventFilter{Entity: "reservation/new"})); n != wantNew {
				t.Errorf("reservation/new has %d events, want %d", n, wantNew)
			}
		})
	}
}

func testReserveEvent(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	r := reservation("r1", "a1", "sb-1", 512, T0)
	mustReserve(t, s, r, at(time.Second))
	got, err := s.Reservations(ctx)
	if err != nil {
		t.Fatalf("Reservations: %v", err)
	}
	if diff := cmp.Diff([]berth.Reservation{r}, got); diff != "" {
		t.Errorf("Reservations (-want +got):\n%s", diff)
	}
	wantEvents(t, s, "reservation/", []berth.Event{
		{At: at(time.Second), Entity: "reservation/r1", From: "", To: "held", Reason: "reserved for sandbox/sb-1 by replica-1", Actor: "replica-1"},
	})
}

// testReserveConcurrent pins LED-1: concurrent Reserves never over-admit an agent.
func testReserveConcurrent(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	const n = 20
	took := concurrently(t, n, func(i int) (bool, error) {
		return s.Reserve(ctx, reservation(fmt.Sprintf("r%02d", i), "a1", fmt.Sprintf("sb-%02d", i), 512, T0), T0)
	})
	count := 0
	for i := range n {
		if took[i] {
			count++
		}
	}
	if count != 4 {
		t.Errorf("%d of %d reserves of 512 MiB against 2048 MiB succeeded, want exactly 4", count, n)
	}
	pending, err := s.Pending(ctx, T0)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	if diff := cmp.Diff(map[string]int64{"a1": 2048}, pending); diff != "" {
		t.Errorf("Pending (-want +got):\n%s", diff)
	}
	if got := len(events(t, s, berth.EventFilter{Entity: "reservation/"})); got != 4 {
		t.Errorf("%d reservation events, want 4", got)
	}
}

func testRelease(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	mustReserve(t, s, reservation("r1", "a1", "sb-1", 512, T0), T0)
	for i, want := range []bool{true, false} { // idempotent
		got, err := s.Release(ctx, "r1")
		if err != nil || got != want {
			t.Errorf("Release(r1) #%d = %v, %v; want %v, nil", i+1, got, err, want)
		}
	}
	if got, err := s.Release(ctx, "never"); err != nil || got {
		t.Errorf("Release(never) = %v, %v; want false, nil", got, err)
	}
	evs := events(t, s, berth.EventFilter{Entity: "reservation/r1"})
	var steps []string
	for _, e := range evs {
		steps = append(steps, e.From+"→"+e.To)
	}
	if diff := cmp.Diff([]string{"→held", "held→released"}, steps); diff != "" {
		t.Errorf("reservation/r1 events (-want +got):\n%s", diff)
	}
	pending, err := s.Pending(ctx, T0)
	if err != nil || len(pending) != 0 {
		t.Errorf("Pending = %v, %v; want empty", pending, err)
	}
}

func testPendingAndReservations(t *testing.T, s berth.Store) {
	ctx := t.Context()
	earlier := at(-time.Minute)
	mustHeartbeat(t, s, heartbeat("a1", 2048), earlier)
	mustHeartbeat(t, s, heartbeat("a2", 2048), earlier)
	rs := []berth.Reservation{
		reservation("r1", "a1", "sb-1", 512, earlier),
		reservation("r2", "a1", "sb-2", 256, at(-30*time.Second)),
		reservation("r3", "a2", "sb-3", 128, at(-30*time.Second)),
	}
	rs[0].ExpiresAt = at(time.Minute)
	rs[2].ExpiresAt = at(-time.Second) // expired at T0, still listed until swept
	for _, r := range rs {
		mustReserve(t, s, r, earlier)
	}
	for _, tc := range []struct {
		now  time.Time
		want map[string]int64
	}{
		{earlier, map[string]int64{"a1": 768, "a2": 128}},
		{T0, map[string]int64{"a1": 768}},
		{at(30 * time.Second), map[string]int64{"a1": 512}}, // r2 expires exactly now
		{at(time.Minute), map[string]int64{}},
	} {
		got, err := s.Pending(ctx, tc.now)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Pending(%v) (-want +got):\n%s", tc.now, diff)
		}
	}
	got, err := s.Reservations(ctx)
	if err != nil {
		t.Fatalf("Reservations: %v", err)
	}
	if diff := cmp.Diff(rs, got); diff != "" {
		t.Errorf("Reservations (-want +got):\n%s", diff)
	}
}

func testSweepReservations(t *testing.T, s berth.Store) {
	ctx := t.Context()
	earlier := at(-time.Minute)
	mustHeartbeat(t, s, heartbeat("a1", 4096), earlier)
	for _, r := range []berth.Reservation{
		{ID: "r1", AgentID: "a1", MiB: 1, Owner: "replica-1", CreatedAt: earlier, ExpiresAt: at(-time.Second)},
		{ID: "r2", AgentID: "a1", MiB: 1, Owner: "replica-1", CreatedAt: earlier, ExpiresAt: T0},
		{ID: "r3", AgentID: "a1", MiB: 1, Owner: "replica-1", CreatedAt: earlier, ExpiresAt: at(time.Millisecond)},
	} {
		mustReserve(t, s, r, earlier)
	}
	for i, want := range []int{2, 0} {
		got, err := s.SweepReservations(ctx, T0)
		if err != nil || got != want {
			t.Errorf("SweepReservations #%d = %d, %v; want %d, nil", i+1, got, err, want)
		}
	}
	if diff := cmp.Diff([]string{"r3"}, reservationIDs(t, s)); diff != "" {
		t.Errorf("reservations after sweep (-want +got):\n%s", diff)
	}
	for _, id := range []string{"r1", "r2"} {
		evs := events(t, s, berth.EventFilter{Entity: "reservation/" + id})
		if len(evs) != 2 || evs[1].From != "held" || evs[1].To != "expired" || !evs[1].At.Equal(T0) {
			t.Errorf("events of %s = %+v, want held then held → expired at T0", id, evs)
		}
	}
}

// testConcurrentWriters pins that concurrent read-then-write transactions queue instead of
// failing or racing: of n creates holding one Idempotency-Key exactly one wins and the others
// get ErrIdempotencyConflict, and n first heartbeats of one agent register it exactly once.
func testConcurrentWriters(t *testing.T, s berth.Store) {
	ctx := t.Context()
	const n = 10
	var wg sync.WaitGroup
	errs := make([]error, n)
	hbErrs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			sb := sandbox(fmt.Sprintf("sb-%02d", i), "acme", "a1", berth.SandboxStarting)
			sb.IdempotencyKey = "same-key"
			errs[i] = s.CreateSandbox(ctx, sb, "test", T0)
		})
		wg.Go(func() {
			_, hbErrs[i] = s.ApplyHeartbeat(ctx, heartbeat("a1", 2048), T0)
		})
	}
	wg.Wait()
	won := 0
	for i := range n {
		switch {
		case errs[i] == nil:
			won++
		case !errors.Is(errs[i], berth.ErrIdempotencyConflict):
			t.Errorf("create sb-%02d: err = %v, want nil or ErrIdempotencyConflict", i, errs[i])
		}
		if hbErrs[i] != nil {
			t.Errorf("heartbeat #%d: %v", i, hbErrs[i])
		}
	}
	if won != 1 {
		t.Errorf("%d creates with one key succeeded, want exactly 1", won)
	}
	if got := len(events(t, s, berth.EventFilter{Entity: "sandbox/"})); got != 1 {
		t.Errorf("%d sandbox events, want 1", got)
	}
	if got := len(events(t, s, berth.EventFilter{Entity: "agent/a1"})); got != 1 {
		t.Errorf("%d agent events, want 1 (registered)", got)
	}
}

// testRenew pins C31's half of LED-2: a renewed reservation keeps counting against its agent
// past its first expiry, so no other create takes its room while its create is in flight; a
// renewal never shortens, never revives what went (released, netted, swept) or had already
// expired, and writes no event.
func testRenew(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 512), T0)
	r := reservation("r1", "a1", "sb-1", 512, T0)
	r.ExpiresAt = at(3 * time.Second)
	mustReserve(t, s, r, T0)
	renew := func(id string, to, now time.Time) bool {
		t.Helper()
		ok, err := s.Renew(ctx, id, to, now)
		if err != nil {
			t.Fatalf("Renew(%s): %v", id, err)
		}
		return ok
	}
	if !renew("r1", at(5*time.Second), at(2*time.Second)) {
		t.Fatal("Renew of a held, unexpired reservation = false, want true")
	}
	if !renew("r1", at(4*time.Second), at(2*time.Second)) {
		t.Fatal("Renew to an earlier expiry = false, want true (still held)")
	}
	if got := reservations(t, s); len(got) != 1 || !got[0].ExpiresAt.Equal(at(5*time.Second)) {
		t.Fatalf("after renewals: %+v, want r1 expiring at T0+5s (never shortened)", got)
	}
	// At T0+4s, past its first expiry: it still counts, so the room is not taken twice.
	if took, err := s.Reserve(ctx, reservation("r2", "a1", "sb-2", 512, at(4*time.Second)), at(4*time.Second)); err != nil || took {
		t.Fatalf("Reserve against a renewed reservation = %v, %v; want false, nil", took, err)
	}
	if n, err := s.SweepReservations(ctx, at(4*time.Second)); err != nil || n != 0 {
		t.Fatalf("SweepReservations at T0+4s = %d, %v; want 0 (renewed to T0+5s)", n, err)
	}
	if p, err := s.Pending(ctx, at(4*time.Second)); err != nil || p["a1"] != 512 {
		t.Fatalf("Pending at T0+4s = %v, %v; want a1: 512", p, err)
	}
	// Expired at now: not revived (its room may be someone else's by now).
	if renew("r1", at(time.Minute), at(5*time.Second)) {
		t.Fatal("Renew of a reservation expired at now = true, want false")
	}
	if _, err := s.Release(ctx, "r1"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if renew("r1", at(time.Minute), T0) || renew("never", at(time.Minute), T0) {
		t.Fatal("Renew of a released or unknown reservation = true, want false")
	}
	if len(reservations(t, s)) != 0 {
		t.Fatal("Renew revived a released reservation")
	}
	var steps []string
	for _, e := range events(t, s, berth.EventFilter{Entity: "reservation/r1"}) {
		steps = append(steps, e.From+"→"+e.To)
	}
	if diff := cmp.Diff([]string{"→held", "held→released"}, steps); diff != "" {
		t.Errorf("reservation/r1 events (-want +got):\n%s", diff)
	}
}

// reservations lists the ledger or fails the test.
func reservations(t *testing.T, s berth.Store) []berth.Reservation {
	t.Helper()
	rs, err := s.Reservations(t.Context())
	if err != nil {
		t.Fatalf("Reservations: %v", err)
	}
	return rs
}

// testReserveAndCreate pins ReserveAndCreate (issue 16, goal 1): the reservation, the row and
// both events together when the room is there; nothing at all when it is not, when another
// sandbox holds the Idempotency-Key, or when the tenant's quota is full.
func testReserveAndCreate(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	sb := sandbox("sb-1", "acme", "a1", berth.SandboxStarting)
	sb.MemoryMiB, sb.IdempotencyKey = 1536, "key-1"
	ok, err := s.ReserveAndCreate(ctx, reservation("r1", "a1", "sb-1", 1536, T0), sb, "tenant/acme", at(time.Second))
	if err != nil || !ok {
		t.Fatalf("ReserveAndCreate with room: %v, %v", ok, err)
	}
	if got, err := s.Sandbox(ctx, "sb-1"); err != nil || got.State != berth.SandboxStarting || got.AgentID != "a1" {
		t.Fatalf("Sandbox(sb-1) = %+v, %v; want starting on a1", got, err)
	}
	wantEvents(t, s, "reservation/", []berth.Event{
		{At: at(time.Second), Entity: "reservation/r1", From: "", To: "held", Reason: "reserved for sandbox/sb-1 by replica-1", Actor: "replica-1"},
	})
	wantEvents(t, s, "sandbox/", []berth.Event{
		{At: at(time.Second), Entity: "sandbox/sb-1", From: "pending", To: "starting", Reason: "placed on agent/a1", Actor: "tenant/acme"},
	})

	nothing := func(what string, r berth.Reservation, sb berth.Sandbox, wantOK bool, wantErr error) {
		t.Helper()
		ok, err := s.ReserveAndCreate(ctx, r, sb, "tenant/acme", at(2*time.Second))
		if ok != wantOK || !errors.Is(err, wantErr) {
			t.Fatalf("%s: ReserveAndCreate = %v, %v; want %v, %v", what, ok, err, wantOK, wantErr)
		}
		if rs := reservations(t, s); len(rs) != 1 {
			t.Errorf("%s: the ledger holds %d reservations, want only r1", what, len(rs))
		}
		if _, err := s.Sandbox(ctx, sb.ID); !errors.Is(err, berth.ErrNotFound) {
			t.Errorf("%s: Sandbox(%s) = %v, want not found", what, sb.ID, err)
		}
		if evs := events(t, s, berth.EventFilter{Entity: "sandbox/" + sb.ID}); len(evs) != 0 {
			t.Errorf("%s: %d events for %s, want none", what, len(evs), sb.ID)
		}
	}
	full := sandbox("sb-2", "acme", "a1", berth.SandboxStarting)
	full.MemoryMiB = 1024
	nothing("no room", reservation("r2", "a1", "sb-2", 1024, T0), full, false, nil)
	keyed := sandbox("sb-3", "acme", "a1", berth.SandboxStarting)
	keyed.MemoryMiB, keyed.IdempotencyKey = 256, "key-1"
	nothing("key held", reservation("r3", "a1", "sb-3", 256, T0), keyed, false, berth.ErrIdempotencyConflict)
	if _, err := s.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: T0}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetQuota(ctx, berth.Quota{Tenant: "acme", MaxSandboxes: 1}, "test", T0); err != nil {
		t.Fatal(err)
	}
	over := sandbox("sb-4", "acme", "a1", berth.SandboxStarting)
	over.MemoryMiB = 256
	nothing("over quota", reservation("r4", "a1", "sb-4", 256, T0), over, false, berth.ErrOverQuota)
}

// testReserveAndCreateConcurrent pins LED-1 for ReserveAndCreate: concurrent creates never
// over-admit an agent, and exactly the ones that reserved have a row.
func testReserveAndCreateConcurrent(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	const n = 20
	took := concurrently(t, n, func(i int) (bool, error) {
		id := fmt.Sprintf("sb-%02d", i)
		sb := sandbox(id, "acme", "a1", berth.SandboxStarting)
		sb.MemoryMiB = 512
		return s.ReserveAndCreate(ctx, reservation(fmt.Sprintf("r%02d", i), "a1", id, 512, T0), sb, "tenant/acme", T0)
	})
	count := 0
	for i := range n {
		_, err := s.Sandbox(ctx, fmt.Sprintf("sb-%02d", i))
		if took[i] {
			count++
			if err != nil {
				t.Errorf("sb-%02d reserved but has no row: %v", i, err)
			}
		} else if !errors.Is(err, berth.ErrNotFound) {
			t.Errorf("sb-%02d not reserved but has a row (err %v)", i, err)
		}
	}
	if count != 4 {
		t.Errorf("%d of %d creates of 512 MiB against 2048 MiB reserved, want exactly 4", count, n)
	}
}

// concurrently runs fn(0…n-1) at once and returns what each reported; an error fails t.
func concurrently(t *testing.T, n int, fn func(i int) (bool, error)) []bool {
	t.Helper()
	var wg sync.WaitGroup
	took := make([]bool, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { took[i], errs[i] = fn(i) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	return took
}
