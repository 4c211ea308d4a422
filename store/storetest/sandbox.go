package storetest

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berth-dev/berth"
)

func testTemplates(t *testing.T, s berth.Store) {
	ctx := t.Context()
	for _, tpl := range []berth.Template{
		{Name: "shell", MemoryMiB: 256, VCPUs: 1},
		{Name: "python", MemoryMiB: 512, VCPUs: 1},
		{Name: "python", MemoryMiB: 1024, VCPUs: 2}, // replaces
	} {
		if err := s.PutTemplate(ctx, tpl); err != nil {
			t.Fatalf("PutTemplate(%+v): %v", tpl, err)
		}
	}
	got, err := s.Template(ctx, "python")
	if err != nil {
		t.Fatalf("Template(python): %v", err)
	}
	if diff := cmp.Diff(berth.Template{Name: "python", MemoryMiB: 1024, VCPUs: 2}, got); diff != "" {
		t.Errorf("Template(python) mismatch (-want +got):\n%s", diff)
	}
	all, err := s.Templates(ctx)
	if err != nil {
		t.Fatalf("Templates: %v", err)
	}
	want := []berth.Template{{Name: "python", MemoryMiB: 1024, VCPUs: 2}, {Name: "shell", MemoryMiB: 256, VCPUs: 1}}
	if diff := cmp.Diff(want, all); diff != "" {
		t.Errorf("Templates mismatch (-want +got):\n%s", diff)
	}
	_, err = s.Template(ctx, "ruby")
	wantNotFound(t, "Template(ruby)", err)
}

func testCreateSandboxRoundTrip(t *testing.T, s berth.Store) {
	ctx := t.Context()
	full := berth.Sandbox{
		ID: "sb-1", Template: "python", Tenant: "acme", AgentID: "a1", State: berth.SandboxStarting,
		MemoryMiB: 1536, VCPUs: 2, Stateful: true, CreatedAt: at(-time.Second), ExpiresAt: at(time.Hour),
		Metadata: map[string]string{"job": "ci-42", "owner": "ana"}, Reason: "placed", IdempotencyKey: "key-1",
		Volume: "data", PausedAt: at(-time.Minute), Image: "img-sb-1", RequestHash: "3f2a",
	}
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("fixture leaves Sandbox.%s zero; set it so the round trip covers it", v.Type().Field(i).Name)
		}
	}
	bare := berth.Sandbox{ID: "sb-2", Template: "shell", Tenant: "acme"} // pending, no agent, no times
	if err := s.CreateSandbox(ctx, full, "tenant/acme", T0); err != nil {
		t.Fatalf("CreateSandbox(full): %v", err)
	}
	if err := s.CreateSandbox(ctx, bare, "tenant/acme", at(time.Second)); err != nil {
		t.Fatalf("CreateSandbox(bare): %v", err)
	}
	got, err := s.Sandbox(ctx, "sb-1")
	if err != nil {
		t.Fatalf("Sandbox(sb-1): %v", err)
	}
	if diff := cmp.Diff(full, got); diff != "" {
		t.Errorf("Sandbox(sb-1) mismatch (-want +got):\n%s", diff)
	}
	got, err = s.Sandbox(ctx, "sb-2")
	if err != nil {
		t.Fatalf("Sandbox(sb-2): %v", err)
	}
	wantBare := bare
	wantBare.State, wantBare.CreatedAt = berth.SandboxPending, at(time.Second) // defaults
	if diff := cmp.Diff(wantBare, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("Sandbox(sb-2) mismatch (-want +got):\n%s", diff)
	}
	wantEvents(t, s, "sandbox/", []berth.Event{
		{At: T0, Entity: "sandbox/sb-1", From: "pending", To: "starting", Reason: "placed on agent/a1", Actor: "tenant/acme"},
		{At: at(time.Second), Entity: "sandbox/sb-2", From: "pending", To: "pending", Reason: "created", Actor: "tenant/acme"},
	})
}

func testTimesAreUTCMilliseconds(t *testing.T, s berth.Store) {
	ctx := t.Context()
	zone := time.FixedZone("UTC+5", 5*3600)
	created := time.Date(2031, 3, 14, 20, 0, 0, 123_456_789, zone)
	sb := sandbox("sb-1", "acme", "", berth.SandboxRunning)
	sb.CreatedAt, sb.ExpiresAt = created, created.Add(time.Minute)
	mustCreate(t, s, sb, created)
	got, err := s.Sandbox(ctx, "sb-1")
	if err != nil {
		t.Fatalf("Sandbox: %v", err)
	}
	want := created.Truncate(time.Millisecond)
	for name, tm := range map[string]time.Time{
		"CreatedAt": got.CreatedAt, "ExpiresAt": got.ExpiresAt.Add(-time.Minute),
		"event At": events(t, s, berth.EventFilter{})[0].At,
	} {
		if tm.Location() != time.UTC || !tm.Equal(want) {
			t.Errorf("%s = %v (%v), want %v in UTC", name, tm, tm.Location(), want.UTC())
		}
	}
}

func testSandboxNotFound(t *testing.T, s berth.Store) {
	ctx := t.Context()
	_, err := s.Sandbox(ctx, "nope")
	wantNotFound(t, "Sandbox(nope)", err)
	ok, err := s.TransitionSandbox(ctx, "nope", nil, berth.SandboxStopped, "deleted", "test", T0)
	wantNotFound(t, "TransitionSandbox(nope)", err)
	if ok {
		t.Errorf("TransitionSandbox(nope) moved = true")
	}
	_, err = s.SandboxByIdempotencyKey(ctx, "acme", "k")
	wantNotFound(t, "SandboxByIdempotencyKey", err)
}

func testIdempotencyConflict(t *testing.T, s berth.Store) {
	ctx := t.Context()
	withKey := func(id, tenant, key string) berth.Sandbox {
		sb := sandbox(id, tenant, "a1", berth.SandboxStarting)
		sb.IdempotencyKey = key
		sb.RequestHash = "hash-of-" + id // C26: the key binds to the request that made it
		return sb
	}
	mustCreate(t, s, withKey("sb-1", "acme", "k1"), T0)
	err := s.CreateSandbox(ctx, withKey("sb-2", "acme", "k1"), "test", T0)
	if !errors.Is(err, berth.ErrIdempotencyConflict) {
		t.Fatalf("second create with key k1: err = %v, want ErrIdempotencyConflict", err)
	}
	_, err = s.Sandbox(ctx, "sb-2")
	wantNotFound(t, "Sandbox(sb-2) after conflict", err)
	wantEvents(t, s, "sandbox/sb-2", nil)

	mustCreate(t, s, withKey("sb-3", "beta", "k1"), T0) // another tenant may use the same key
	for _, tc := range []struct{ tenant, key, want string }{
		{"acme", "k1", "sb-1"},
		{"beta", "k1", "sb-3"},
	} {
		got, err := s.SandboxByIdempotencyKey(ctx, tc.tenant, tc.key)
		if err != nil || got.ID != tc.want || got.RequestHash != "hash-of-"+tc.want {
			t.Errorf("SandboxByIdempotencyKey(%s, %s) = %q (request hash %q), %v; want %q", tc.tenant, tc.key, got.ID, got.RequestHash, err, tc.want)
		}
	}
	_, err = s.SandboxByIdempotencyKey(ctx, "acme", "k2")
	wantNotFound(t, "SandboxByIdempotencyKey(acme, k2)", err)

	// A stopped sandbox keeps its key: the retry must see the first outcome (API-4).
	mustTransition(t, s, "sb-3", berth.SandboxStopped, "deleted", at(time.Second))
	if err := s.CreateSandbox(ctx, withKey("sb-4", "beta", "k1"), "test", T0); !errors.Is(err, berth.ErrIdempotencyConflict) {
		t.Errorf("create over a stopped sandbox's key: err = %v, want ErrIdempotencyConflict", err)
	}
}

func testFailedFreesIdempotencyKey(t *testing.T, s berth.Store) {
	ctx := t.Context()
	sb := sandbox("sb-1", "acme", "a1", berth.SandboxStarting)
	sb.IdempotencyKey = "k1"
	mustCreate(t, s, sb, T0)
	mustTransition(t, s, "sb-1", berth.SandboxFailed, "agent refused", at(time.Second))
	_, err := s.SandboxByIdempotencyKey(ctx, "acme", "k1")
	wantNotFound(t, "SandboxByIdempotencyKey after failed", err)
	retry := sandbox("sb-2", "acme", "a2", berth.SandboxStarting)
	retry.IdempotencyKey = "k1"
	if err := s.CreateSandbox(ctx, retry, "test", at(2*time.Second)); err != nil {
		t.Fatalf("create retry after failed: %v", err)
	}
	got, err := s.SandboxByIdempotencyKey(ctx, "acme", "k1")
	if err != nil || got.ID != "sb-2" {
		t.Errorf("SandboxByIdempotencyKey = %q, %v; want sb-2", got.ID, err)
	}
	failed, err := s.Sandbox(ctx, "sb-1")
	if err != nil {
		t.Fatalf("Sandbox(sb-1): %v", err)
	}
	if failed.State != berth.SandboxFailed || failed.Reason != "agent refused" {
		t.Errorf("sb-1 = %s (%q), want failed (agent refused)", failed.State, failed.Reason)
	}
}

// testRanThenFailedKeepsIdempotencyKey (C26): a sandbox that ran and then failed keeps its
// Idempotency-Key — a replay answers it, and another create with the key is a conflict — so
// a key is never bound to two different sandboxes that both ran.
func testRanThenFailedKeepsIdempotencyKey(t *testing.T, s berth.Store) {
	ctx := t.Context()
	for i, from := range []berth.SandboxState{berth.SandboxRunning, berth.SandboxPaused, berth.SandboxStopping} {
		id, key := fmt.Sprintf("sb-%d", i), fmt.Sprintf("k%d", i)
		sb := sandbox(id, "acme", "a1", from)
		sb.IdempotencyKey = key
		mustCreate(t, s, sb, T0)
		mustTransition(t, s, id, berth.SandboxFailed, "init died", at(time.Second))
		got, err := s.SandboxByIdempotencyKey(ctx, "acme", key)
		if err != nil || got.ID != id {
			t.Errorf("%s → failed: SandboxByIdempotencyKey(%s) = %q, %v; want %s (the key stays bound)", from, key, got.ID, err, id)
		}
		again := sandbox(id+"-again", "acme", "a1", berth.SandboxStarting)
		again.IdempotencyKey = key
		if err := s.CreateSandbox(ctx, again, "test", at(2*time.Second)); !errors.Is(err, berth.ErrIdempotencyConflict) {
			t.Errorf("%s → failed: another create with key %s: err = %v, want ErrIdempotencyConflict", from, key, err)
		}
	}
}

func testTransitionSandbox(t *testing.T, s berth.Store) {
	ctx := t.Context()
	S := func(states ...berth.SandboxState) []berth.SandboxState { return states }
	tests := []struct {
		name  string
		start berth.SandboxState
		from  []berth.SandboxState
		to    berth.SandboxState
		moved bool
	}{
		{"any non-terminal", berth.SandboxRunning, nil, berth.SandboxStopping, true},
		{"from matches", berth.SandboxRunning, S(berth.SandboxStarting, berth.SandboxRunning), berth.SandboxStopped, true},
		{"from does not match", berth.SandboxStarting, S(berth.SandboxRunning), berth.SandboxStopped, false},
		{"terminal is final by default", berth.SandboxStopped, nil, berth.SandboxLost, false},
		{"terminal left when named", berth.SandboxFailed, S(berth.SandboxFailed), berth.SandboxLost, true},
		{"same state is no transition", berth.SandboxRunning, nil, berth.SandboxRunning, false},
		{"pending to starting", berth.SandboxPending, S(berth.SandboxPending), berth.SandboxStarting, true},
	}
	for i, tc := range tests {
		id := "sb-" + string(rune('a'+i))
		sb := sandbox(id, "acme", "a1", tc.start)
		sb.Reason = "initial"
		mustCreate(t, s, sb, T0)
		moved, err := s.TransitionSandbox(ctx, id, tc.from, tc.to, "why", "actor-x", at(time.Second))
		if err != nil || moved != tc.moved {
			t.Errorf("%s: TransitionSandbox(%s → %s) = %v, %v; want %v, nil", tc.name, tc.start, tc.to, moved, err, tc.moved)
			continue
		}
		got, err := s.Sandbox(ctx, id)
		if err != nil {
			t.Fatalf("%s: Sandbox: %v", tc.name, err)
		}
		wantState, wantReason := tc.start, "initial"
		want := []berth.Event{{At: T0, Entity: "sandbox/" + id, From: "pending", To: string(tc.start), Reason: "placed on agent/a1", Actor: "test"}}
		if tc.moved {
			wantState, wantReason = tc.to, "why"
			want = append(want, berth.Event{At: at(time.Second), Entity: "sandbox/" + id, From: string(tc.start), To: string(tc.to), Reason: "why", Actor: "actor-x"})
		}
		if got.State != wantState || got.Reason != wantReason {
			t.Errorf("%s: sandbox = %s (%q), want %s (%q)", tc.name, got.State, got.Reason, wantState, wantReason)
		}
		wantEvents(t, s, "sandbox/"+id, want)
	}
}

func testTerminalReleases(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 4096), T0)
	mustCreate(t, s, sandbox("sb-1", "acme", "a1", berth.SandboxStarting), T0)
	mustReserve(t, s, reservation("r1", "a1", "sb-1", 1024, T0), T0)
	mustReserve(t, s, reservation("r2", "a1", "sb-2", 512, T0), T0)

	mustTransition(t, s, "sb-1", berth.SandboxStopping, "deleted", at(time.Second))
	if diff := cmp.Diff([]string{"r1", "r2"}, reservationIDs(t, s)); diff != "" {
		t.Errorf("after a non-terminal transition, reservations (-want +got):\n%s", diff)
	}
	ok, err := s.TransitionSandbox(ctx, "sb-1", nil, berth.SandboxStopped, "deleted", "server/r1", at(2*time.Second))
	if err != nil || !ok {
		t.Fatalf("TransitionSandbox(stopped) = %v, %v", ok, err)
	}
	if diff := cmp.Diff([]string{"r2"}, reservationIDs(t, s)); diff != "" {
		t.Errorf("after stopped, reservations (-want +got):\n%s", diff)
	}
	wantEvents(t, s, "reservation/r1", []berth.Event{
		{At: T0, Entity: "reservation/r1", From: "", To: "held", Reason: "reserved for sandbox/sb-1 by replica-1", Actor: "replica-1"},
		{At: at(2 * time.Second), Entity: "reservation/r1", From: "held", To: "released", Reason: "sandbox stopped", Actor: "server/r1"},
	})
	pending, err := s.Pending(ctx, at(2*time.Second))
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	if diff := cmp.Diff(map[string]int64{"a1": 512}, pending); diff != "" {
		t.Errorf("Pending (-want +got):\n%s", diff)
	}
}

func testSandboxesFilter(t *testing.T, s berth.Store) {
	ctx := t.Context()
	for i, sb := range []berth.Sandbox{
		sandbox("sb-1", "acme", "a1", berth.SandboxRunning),
		sandbox("sb-2", "beta", "a1", berth.SandboxRunning),
		sandbox("sb-3", "acme", "a2", berth.SandboxStopped),
		sandbox("sb-4", "acme", "a2", berth.SandboxRunning),
	} {
		sb.CreatedAt = at(time.Duration(i) * time.Second)
		mustCreate(t, s, sb, sb.CreatedAt)
	}
	tests := []struct {
		name   string
		filter berth.SandboxFilter
		want   []string
	}{
		{"all newest first", berth.SandboxFilter{}, []string{"sb-4", "sb-3", "sb-2", "sb-1"}},
		{"tenant", berth.SandboxFilter{Tenant: "acme"}, []string{"sb-4", "sb-3", "sb-1"}},
		{"state", berth.SandboxFilter{State: berth.SandboxRunning}, []string{"sb-4", "sb-2", "sb-1"}},
		{"agent", berth.SandboxFilter{AgentID: "a2"}, []string{"sb-4", "sb-3"}},
		{"all fields", berth.SandboxFilter{Tenant: "acme", State: berth.SandboxRunning, AgentID: "a1"}, []string{"sb-1"}},
		{"limit keeps the newest", berth.SandboxFilter{Limit: 2}, []string{"sb-4", "sb-3"}},
		{"nothing", berth.SandboxFilter{Tenant: "gamma"}, nil},
		{"oldest first", berth.SandboxFilter{OldestFirst: true}, []string{"sb-1", "sb-2", "sb-3", "sb-4"}},
		{"oldest first, a page", berth.SandboxFilter{OldestFirst: true, Limit: 2}, []string{"sb-1", "sb-2"}},
		{"oldest first after a cursor", berth.SandboxFilter{State: berth.SandboxRunning, OldestFirst: true,
			After: berth.SandboxKey{CreatedAt: at(0), ID: "sb-1"}}, []string{"sb-2", "sb-4"}},
		// The cursor's time alone does not skip a row of the same millisecond: ids order them.
		{"a cursor's id breaks a tie", berth.SandboxFilter{OldestFirst: true,
			After: berth.SandboxKey{CreatedAt: at(3 * time.Second), ID: "sb-3"}}, []string{"sb-4"}},
		{"after the last", berth.SandboxFilter{OldestFirst: true,
			After: berth.SandboxKey{CreatedAt: at(3 * time.Second), ID: "sb-4"}}, nil},
	}
	for _, tc := range tests {
		got, err := s.Sandboxes(ctx, tc.filter)
		if err != nil {
			t.Fatalf("%s: Sandboxes: %v", tc.name, err)
		}
		var ids []string
		for _, sb := range got {
			ids = append(ids, sb.ID)
		}
		if diff := cmp.Diff(tc.want, ids); diff != "" {
			t.Errorf("%s: Sandboxes(%+v) ids (-want +got):\n%s", tc.name, tc.filter, diff)
		}
	}
}

// testOrderingIsBytewise pins that every "ordered by name/id" list sorts by bytes, as SQLite's
// BINARY collation does, whatever collation a server database defaults to: upper case before
// '_' before lower case, '-' before digits.
func testOrderingIsBytewise(t *testing.T, s berth.Store) {
	ctx := t.Context()
	names := []string{"b", "a_1", "_x", "a1", "B", "a-1"}
	want := []string{"B", "_x", "a-1", "a1", "a_1", "b"}
	for _, n := range names {
		if err := s.PutTemplate(ctx, berth.Template{Name: n, MemoryMiB: 256, VCPUs: 1}); err != nil {
			t.Fatalf("PutTemplate(%s): %v", n, err)
		}
		if _, err := s.PutTenant(ctx, berth.Tenant{Name: n, CreatedAt: T0}); err != nil {
			t.Fatalf("PutTenant(%s): %v", n, err)
		}
		mustHeartbeat(t, s, heartbeat(n, 1024), T0)
		mustCreate(t, s, sandbox(n, "acme", "a1", berth.SandboxRunning), T0) // one created_at: ties by id
	}
	var got struct{ templates, tenants, agents, sandboxes []string }
	tpls, err := s.Templates(ctx)
	if err != nil {
		t.Fatalf("Templates: %v", err)
	}
	for _, x := range tpls {
		got.templates = append(got.templates, x.Name)
	}
	tns, err := s.Tenants(ctx)
	if err != nil {
		t.Fatalf("Tenants: %v", err)
	}
	for _, x := range tns {
		got.tenants = append(got.tenants, x.Name)
	}
	ags, err := s.Agents(ctx)
	if err != nil {
		t.Fatalf("Agents: %v", err)
	}
	for _, x := range ags {
		got.agents = append(got.agents, x.AgentID)
	}
	sbs, err := s.Sandboxes(ctx, berth.SandboxFilter{})
	if err != nil {
		t.Fatalf("Sandboxes: %v", err)
	}
	for _, x := range sbs {
		got.sandboxes = append([]string{x.ID}, got.sandboxes...) // newest first, ties by id descending
	}
	for name, ids := range map[string][]string{"Templates": got.templates, "Tenants": got.tenants, "Agents": got.agents, "Sandboxes (reversed)": got.sandboxes} {
		if diff := cmp.Diff(want, ids); diff != "" {
			t.Errorf("%s order (-want +got):\n%s", name, diff)
		}
	}
}

// liveAndGone creates, on agent a1, sandbox "live" running and sandbox "gone" lost (at T0 + 1 s).
func liveAndGone(t *testing.T, s berth.Store) {
	t.Helper()
	mustCreate(t, s, sandbox("live", "acme", "a1", berth.SandboxRunning), T0)
	mustCreate(t, s, sandbox("gone", "acme", "a1", berth.SandboxRunning), T0)
	mustTransition(t, s, "gone", berth.SandboxLost, "lease expired", at(time.Second))
}

// copies names copies of ids as an agent that does not number them lists them.
func copies(ids ...string) []berth.HeldCopy {
	out := make([]berth.HeldCopy, len(ids))
	for i, id := range ids {
		out[i] = berth.HeldCopy{ID: id}
	}
	return out
}

// staleAndElsewhere adds sandboxes placed elsewhere: "moved" runs on a2, "paused" on no host,
// "resuming" is being restored on a2, and "pausing" is being checkpointed on a1 (still a1's).
func staleAndElsewhere(t *testing.T, s berth.Store) {
	t.Helper()
	mustCreate(t, s, sandbox("moved", "acme", "a2", berth.SandboxRunning), T0)
	mustCreate(t, s, sandbox("paused", "acme", "", berth.SandboxPaused), T0)
	mustCreate(t, s, sandbox("resuming", "acme", "a2", berth.SandboxResuming), T0)
	mustCreate(t, s, sandbox("pausing", "acme", "a1", berth.SandboxPausing), T0)
}

// testEndedSandboxes: among the copies an agent holds, the terminal and the unknown ones are
// what it should stop (AGT-6), and so are, by incarnation, the live ones the store places on
// another agent or on none; its own live ones are neither.
func testEndedSandboxes(t *testing.T, s berth.Store) {
	ctx := t.Context()
	liveAndGone(t, s)
	staleAndElsewhere(t, s)
	mustCreate(t, s, sandbox("starting", "acme", "a1", berth.SandboxStarting), T0)
	held := []berth.HeldCopy{{ID: "live", Boot: "b", Incarnation: 1}, {ID: "paused", Boot: "b", Incarnation: 7}, {ID: "gone", Incarnation: 2},
		{ID: "starting"}, {ID: "moved", Boot: "b", Incarnation: 3}, {ID: "never-heard-of"}, {ID: "resuming"}, {ID: "pausing", Incarnation: 9}}
	got, err := s.EndedSandboxes(ctx, "a1", held)
	if err != nil {
		t.Fatal(err)
	}
	want := berth.HeldCheck{Ended: []string{"gone", "never-heard-of"},
		Stale: []berth.HeldCopy{{ID: "paused", Boot: "b", Incarnation: 7}, {ID: "moved", Boot: "b", Incarnation: 3}, {ID: "resuming"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("EndedSandboxes (-want +got):\n%s", diff)
	}
	if got, err := s.EndedSandboxes(ctx, "a1", nil); err != nil || len(got.Ended)+len(got.Stale) != 0 {
		t.Fatalf("EndedSandboxes(nil) = %+v, %v", got, err)
	}
	// The same copies, held by a2: "moved" and "resuming" are its own, "live" and "pausing" are a1's.
	got, err = s.EndedSandboxes(ctx, "a2", held)
	if err != nil {
		t.Fatal(err)
	}
	want.Stale = []berth.HeldCopy{{ID: "live", Boot: "b", Incarnation: 1}, {ID: "paused", Boot: "b", Incarnation: 7}, {ID: "starting"},
		{ID: "pausing", Incarnation: 9}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("EndedSandboxes of a2 (-want +got):\n%s", diff)
	}
}

// testHeldEnded: the sweep's read (AGT-6) answers what the agent's held list names, not
// starting, which of those the store ended or never knew, and which it places elsewhere, with
// the incarnation the list holds; another agent's list and an unknown agent's are not mixed in.
func testHeldEnded(t *testing.T, s berth.Store) {
	ctx := t.Context()
	liveAndGone(t, s)
	staleAndElsewhere(t, s)
	mustCreate(t, s, sandbox("other", "acme", "a2", berth.SandboxRunning), T0)
	hb1 := heartbeat("a1", 2048)
	hb1.Sandboxes = []berth.HeldSandbox{{ID: "live", Incarnation: 1}, {ID: "gone"}, {ID: "never-heard-of"},
		{ID: "new", Starting: true}, {ID: "moved", Incarnation: 4}, {ID: "paused", Incarnation: 5}, {ID: "pausing", Incarnation: 6}}
	mustHeartbeat(t, s, hb1, at(2*time.Second))
	hb := heartbeat("a2", 2048)
	hb.Sandboxes = []berth.HeldSandbox{{ID: "other"}, {ID: "a2-unknown"}}
	mustHeartbeat(t, s, hb, at(2*time.Second))
	held, got, err := s.HeldEnded(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"gone", "live", "moved", "never-heard-of", "paused", "pausing"}, held); diff != "" {
		t.Errorf("HeldEnded held (-want +got):\n%s", diff)
	}
	want := berth.HeldCheck{Ended: []string{"gone", "never-heard-of"},
		Stale: []berth.HeldCopy{{ID: "moved", Boot: hb1.BootID, Incarnation: 4}, {ID: "paused", Boot: hb1.BootID, Incarnation: 5}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("HeldEnded (-want +got):\n%s", diff)
	}
	// A new boot's whole list replaces the held list, and its incarnations are that boot's.
	hb1.BootID, hb1.Seq = "boot-2", 1
	hb1.Sandboxes = []berth.HeldSandbox{{ID: "paused", Incarnation: 1}}
	mustHeartbeat(t, s, hb1, at(3*time.Second))
	if _, got, err := s.HeldEnded(ctx, "a1"); err != nil || !cmp.Equal(got.Stale, []berth.HeldCopy{{ID: "paused", Boot: "boot-2", Incarnation: 1}}) {
		t.Errorf("HeldEnded after a new boot = %+v, %v; want paused as boot-2's incarnation 1", got, err)
	}
	if held, got, err := s.HeldEnded(ctx, "nobody"); err != nil || len(held)+len(got.Ended)+len(got.Stale) != 0 {
		t.Errorf("HeldEnded of an unknown agent = %v, %+v, %v; want nothing", held, got, err)
	}
}

// testEndedSandboxesLongList: a held list longer than one query's worth of ids (an agent with
// thousands of sandboxes, AGT-6) is answered in full, in the order asked: live ids at the
// start, middle and end of it are kept, every other id is ended.
func testEndedSandboxesLongList(t *testing.T, s berth.Store) {
	live := map[string]bool{"id-0000": true, "id-0777": true, "id-1299": true}
	for id := range live {
		mustCreate(t, s, sandbox(id, "acme", "a1", berth.SandboxRunning), T0)
	}
	var ids, want []string
	for i := range 1300 {
		id := fmt.Sprintf("id-%04d", i)
		ids = append(ids, id)
		if !live[id] {
			want = append(want, id)
		}
	}
	got, err := s.EndedSandboxes(t.Context(), "a1", copies(ids...))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got.Ended); diff != "" || len(got.Stale) != 0 {
		t.Fatalf("EndedSandboxes of 1300 ids (-want +got):\n%s\nstale: %v", diff, got.Stale)
	}
}

// testSandboxReads: the reads a refusal's estimate and a drain's status make (API-3, C11).
// ExpiringFirst lists running sandboxes with an expiry by (expiry, id), pages exactly by its
// cursor — ties of one millisecond included — and leaves out what does not run;
// SandboxesByID answers known ids once each, at any length; SandboxFilter.Live keeps a live
// sandbox however many ended ones are newer.
func testSandboxReads(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mk := func(id, agent string, st berth.SandboxState, expires time.Time) {
		sb := sandbox(id, "acme", agent, st)
		sb.ExpiresAt = expires
		mustCreate(t, s, sb, T0)
	}
	mk("e-late", "a1", berth.SandboxRunning, at(3*time.Minute))
	mk("e-tie-b", "a2", berth.SandboxRunning, at(time.Minute))
	mk("e-tie-a", "a1", berth.SandboxRunning, at(time.Minute))
	mk("e-first", "a2", berth.SandboxRunning, at(30*time.Second))
	mk("e-none", "a1", berth.SandboxRunning, time.Time{})
	mk("e-starting", "a1", berth.SandboxStarting, at(time.Second))
	mk("e-ended", "a1", berth.SandboxRunning, at(2*time.Second))
	mustTransition(t, s, "e-ended", berth.SandboxStopped, "test", T0)

	var got []string
	for from := (berth.Expiry{}); len(got) < 10; {
		page, err := s.ExpiringFirst(ctx, from, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			got = append(got, e.SandboxID+"@"+e.AgentID+"+"+e.At.Sub(T0).String())
		}
		if len(page) < 2 {
			break
		}
		from = page[len(page)-1]
	}
	want := []string{"e-first@a2+30s", "e-tie-a@a1+1m0s", "e-tie-b@a2+1m0s", "e-late@a1+3m0s"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ExpiringFirst in pages of 2 (-want +got):\n%s", diff)
	}
	after, err := s.ExpiringFirst(ctx, berth.Expiry{At: at(time.Minute)}, 10)
	if err != nil || len(after) != 3 || after[0].SandboxID != "e-tie-a" {
		t.Errorf("ExpiringFirst after the tie's time with no id = %v, %v; want both of the tie, then e-late", after, err)
	}
	for _, limit := range []int{0, -1} { // SQLite read LIMIT -1 as no limit; PostgreSQL refused it
		if none, err := s.ExpiringFirst(ctx, berth.Expiry{}, limit); err != nil || len(none) != 0 {
			t.Errorf("ExpiringFirst with limit %d = %v, %v; want none", limit, none, err)
		}
	}

	ids := []string{"e-late", "e-ended", "nope", "e-late"}
	for i := range 1200 {
		ids = append(ids, fmt.Sprintf("unknown-%04d", i))
	}
	ids = append(ids, "e-first")
	sbs, err := s.SandboxesByID(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]berth.SandboxState{}
	for _, sb := range sbs {
		byID[sb.ID] = sb.State
	}
	wantByID := map[string]berth.SandboxState{"e-late": berth.SandboxRunning, "e-ended": berth.SandboxStopped, "e-first": berth.SandboxRunning}
	if diff := cmp.Diff(wantByID, byID); diff != "" || len(sbs) != 3 {
		t.Errorf("SandboxesByID of 1,205 ids, 3 known, one repeated: %d answers (-want +got):\n%s", len(sbs), diff)
	}

	mk("d-live", "a3", berth.SandboxRunning, at(time.Hour))
	for i := range 5 {
		id := fmt.Sprintf("d-ended-%d", i)
		sb := sandbox(id, "acme", "a3", berth.SandboxRunning)
		sb.CreatedAt = T0.Add(time.Duration(i+1) * time.Second)
		mustCreate(t, s, sb, T0)
		mustTransition(t, s, id, berth.SandboxStopped, "test", T0)
	}
	live, err := s.Sandboxes(ctx, berth.SandboxFilter{AgentID: "a3", Live: true, Limit: 2})
	if err != nil || len(live) != 1 || live[0].ID != "d-live" {
		t.Errorf("Sandboxes(a3, Live, Limit 2) = %v, %v; want d-live alone past five newer ended", live, err)
	}
}
