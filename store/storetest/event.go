package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

func testEventsFilter(t *testing.T, s berth.Store) {
	// Four events, one per second: agent/a1, sandbox/sb-1, sandbox/sb-10, sandbox/sb-1 again.
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	mustCreate(t, s, sandbox("sb-1", "acme", "a1", berth.SandboxStarting), at(time.Second))
	mustCreate(t, s, sandbox("sb-10", "acme", "a1", berth.SandboxStarting), at(2*time.Second))
	mustTransition(t, s, "sb-1", berth.SandboxRunning, "started", at(3*time.Second))
	const (
		agent   = "agent/a1 →active"
		sb1     = "sandbox/sb-1 pending→starting"
		sb10    = "sandbox/sb-10 pending→starting"
		sb1Runs = "sandbox/sb-1 starting→running"
	)
	tests := []struct {
		name   string
		filter berth.EventFilter
		want   []string
	}{
		{"all, oldest first", berth.EventFilter{}, []string{agent, sb1, sb10, sb1Runs}},
		{"exact entity is not a prefix", berth.EventFilter{Entity: "sandbox/sb-1"}, []string{sb1, sb1Runs}},
		{"prefix ending in slash", berth.EventFilter{Entity: "sandbox/"}, []string{sb1, sb10, sb1Runs}},
		{"other prefix", berth.EventFilter{Entity: "agent/"}, []string{agent}},
		{"no slash means exact", berth.EventFilter{Entity: "sandbox"}, nil},
		{"prefix is case-sensitive", berth.EventFilter{Entity: "SANDBOX/"}, nil},
		{"since is inclusive", berth.EventFilter{Since: at(2 * time.Second)}, []string{sb10, sb1Runs}},
		{"since after everything", berth.EventFilter{Since: at(time.Hour)}, nil},
		{"limit keeps the latest, oldest first", berth.EventFilter{Limit: 2}, []string{sb10, sb1Runs}},
		{"prefix and limit", berth.EventFilter{Entity: "sandbox/", Limit: 2}, []string{sb10, sb1Runs}},
		{"entity and since", berth.EventFilter{Entity: "sandbox/sb-1", Since: at(2 * time.Second)}, []string{sb1Runs}},
	}
	for _, tc := range tests {
		evs := events(t, s, tc.filter)
		var got []string
		for _, e := range evs {
			got = append(got, e.Entity+" "+e.From+"→"+e.To)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: Events(%+v) (-want +got):\n%s", tc.name, tc.filter, diff)
		}
	}
	all := events(t, s, berth.EventFilter{})
	for i, e := range all {
		if i > 0 && e.ID <= all[i-1].ID {
			t.Errorf("event ids not increasing: %d after %d", e.ID, all[i-1].ID)
		}
		if want := at(time.Duration(i) * time.Second); !e.At.Equal(want) || e.At.Location() != time.UTC {
			t.Errorf("event %d At = %v, want %v UTC", i, e.At, want)
		}
	}
}

// testTenants: PutTenant creates a tenant once and says so; a second PutTenant of a taken name,
// at another time, reports created=false and leaves the first row as it was.
func testTenants(t *testing.T, s berth.Store) {
	ctx := t.Context()
	for _, tc := range []struct {
		tn      berth.Tenant
		created bool
	}{
		{berth.Tenant{Name: "beta", CreatedAt: at(time.Second)}, true},
		{berth.Tenant{Name: "acme", CreatedAt: T0}, true},
		{berth.Tenant{Name: "acme", CreatedAt: at(time.Hour)}, false}, // exists: left as is
		{berth.Tenant{Name: "acme", CreatedAt: T0}, false},            // the same time: still taken
	} {
		created, err := s.PutTenant(ctx, tc.tn)
		if err != nil || created != tc.created {
			t.Fatalf("PutTenant(%+v) = %v, %v; want created %v", tc.tn, created, err, tc.created)
		}
	}
	got, err := s.Tenants(ctx)
	if err != nil {
		t.Fatalf("Tenants: %v", err)
	}
	want := []berth.Tenant{{Name: "acme", CreatedAt: T0}, {Name: "beta", CreatedAt: at(time.Second)}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Tenants (-want +got):\n%s", diff)
	}
}

// testTenantCreatedOnce: replicas creating one tenant at once, all stamped the same
// millisecond, are told created by the store exactly once (POST /v1/tenants answers one 201
// and the rest 409 from it).
func testTenantCreatedOnce(t *testing.T, s berth.Store) {
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for range n {
		wg.Go(func() {
			created, err := s.PutTenant(t.Context(), berth.Tenant{Name: "acme", CreatedAt: T0})
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if created {
				wins++
			}
		})
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d of %d concurrent PutTenant calls for one name reported created; want exactly 1", wins, n)
	}
	got, err := s.Tenants(t.Context())
	if diff := cmp.Diff([]berth.Tenant{{Name: "acme", CreatedAt: T0}}, got); err != nil || diff != "" {
		t.Errorf("Tenants after the race: %v (-want +got):\n%s", err, diff)
	}
}

func testAPIKeys(t *testing.T, s berth.Store) {
	ctx := t.Context()
	key := berth.APIKey{ID: "k1", Tenant: "acme", Role: berth.RoleTenant, Hash: "aa11", CreatedAt: T0}
	wantNotFound(t, "PutAPIKey for a missing tenant", s.PutAPIKey(ctx, key))
	if _, err := s.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: T0}); err != nil {
		t.Fatalf("PutTenant: %v", err)
	}
	if err := s.PutAPIKey(ctx, key); err != nil {
		t.Fatalf("PutAPIKey: %v", err)
	}
	admin := berth.APIKey{ID: "k2", Tenant: "acme", Role: berth.RoleAdmin, Hash: "bb22", CreatedAt: at(time.Second)}
	if err := s.PutAPIKey(ctx, admin); err != nil {
		t.Fatalf("PutAPIKey(admin): %v", err)
	}
	for _, want := range []berth.APIKey{key, admin} {
		got, err := s.APIKeyByHash(ctx, want.Hash)
		if err != nil {
			t.Fatalf("APIKeyByHash(%s): %v", want.Hash, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("APIKeyByHash(%s) (-want +got):\n%s", want.Hash, diff)
		}
	}
	_, err := s.APIKeyByHash(ctx, "cc33")
	wantNotFound(t, "APIKeyByHash(unknown)", err)
	if err := s.PutAPIKey(ctx, berth.APIKey{ID: "k3", Tenant: "acme", Role: berth.RoleTenant, Hash: "aa11"}); err == nil {
		t.Errorf("PutAPIKey with another key's hash: err = nil, want an error")
	}
}

// testEventsUntilAndTo: Until is exclusive and To selects transitions into one state.
func testEventsUntilAndTo(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustCreate(t, s, sandbox("sb-1", "acme", "a1", berth.SandboxRunning), T0)
	mustTransition(t, s, "sb-1", berth.SandboxLost, "lease expired", at(2*time.Second))
	got, err := s.Events(ctx, berth.EventFilter{Entity: "sandbox/", Until: at(2 * time.Second)})
	if err != nil || len(got) != 1 || got[0].To != "running" {
		t.Fatalf("Until: %+v, %v; want only the create", got, err)
	}
	got, err = s.Events(ctx, berth.EventFilter{To: "lost"})
	if err != nil || len(got) != 1 || got[0].Entity != "sandbox/sb-1" {
		t.Fatalf("To lost: %+v, %v", got, err)
	}
}

// testLogEvents: a store that logs events (berth.EventLogger) hands over exactly what it
// committed, after the commit; a write that changes nothing logs nothing (LIF-3).
func testLogEvents(t *testing.T, s berth.Store) {
	el, ok := s.(berth.EventLogger)
	if !ok {
		t.Skip("this store does not log events")
	}
	var mu sync.Mutex
	var logged []berth.Event
	el.LogEvents(func(e berth.Event) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, e)
	})
	defer el.LogEvents(nil)
	mustCreate(t, s, sandbox("sb-1", "acme", "a1", berth.SandboxRunning), T0)
	mustTransition(t, s, "sb-1", berth.SandboxStopped, "deleted", at(time.Second))
	dup := sandbox("sb-2", "acme", "a1", berth.SandboxRunning)
	if err := s.CreateSandbox(t.Context(), dup, "test", T0); err != nil {
		t.Fatal(err)
	}
	dup.ID = "sb-1" // a second insert of an existing id fails and is rolled back
	_ = s.CreateSandbox(t.Context(), dup, "test", T0)
	// starting → running is the create path's one-from transition (one statement on
	// PostgreSQL): logged once when it moves, not at all when the row is elsewhere.
	mustCreate(t, s, sandbox("sb-3", "acme", "a1", berth.SandboxStarting), T0)
	for i, want := range []bool{true, false} {
		moved, err := s.TransitionSandbox(t.Context(), "sb-3", []berth.SandboxState{berth.SandboxStarting},
			berth.SandboxRunning, "agent started it", "test", at(2*time.Second))
		if err != nil || moved != want {
			t.Fatalf("transition %d: moved %v, err %v; want moved %v", i, moved, err, want)
		}
	}
	stored, err := s.Events(t.Context(), berth.EventFilter{Entity: "sandbox/"})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(stored, logged, eventOpts); diff != "" {
		t.Fatalf("logged events differ from the stored ones (-stored +logged):\n%s", diff)
	}
}
