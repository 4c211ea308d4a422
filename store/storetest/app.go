package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

// testApps pins the app record (APP-1): it reads back exactly as written, a taken name is
// ErrAppExists, writes are a compare-and-set on the revision (of two writers holding the same
// revision exactly one wins), every state change writes one event with the right from/to and
// a write that keeps the state writes none, and a delete records "deleted".
func testApps(t *testing.T, s berth.Store) {
	ctx := t.Context()
	if _, err := s.App(ctx, "web"); !errors.Is(err, berth.ErrNotFound) {
		t.Fatalf("unknown app: %v", err)
	}
	a := berth.App{
		Name: "web", Tenant: "acme", Version: 1, Desired: berth.DesireRunning, State: berth.AppDeploying,
		Spec: berth.AppSpec{Template: "python", MemoryMiB: 128, Command: []string{"python3", "app.py"},
			Files: map[string]string{"app.py": "print(1)\n"}, Env: map[string]string{"A": "b"}, Port: 8080},
		IdleSeconds: 60, WaitingSince: at(1500 * time.Microsecond),
	}
	created, err := s.CreateApp(ctx, a, "test", T0)
	if err != nil || created.Revision != 1 || !created.CreatedAt.Equal(T0) {
		t.Fatalf("CreateApp: %+v, %v", created, err)
	}
	got, err := s.App(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(created, got); diff != "" {
		t.Fatalf("app does not read back as written (-created +read):\n%s", diff)
	}
	if !got.WaitingSince.Equal(T0.Add(time.Millisecond)) {
		t.Errorf("WaitingSince %v: want T0+1ms (millisecond precision)", got.WaitingSince)
	}
	if _, err := s.CreateApp(ctx, berth.App{Name: "web", Tenant: "other", State: berth.AppHibernated}, "test", T0); !errors.Is(err, berth.ErrAppExists) {
		t.Fatalf("taken name: %v; want ErrAppExists", err)
	}
	if _, err := s.CreateApp(ctx, berth.App{Name: "api", Tenant: "other", State: berth.AppHibernated}, "test", T0); err != nil {
		t.Fatal(err)
	}

	// Two writers read revision 1; exactly one write lands.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() {
			w := got
			w.State, w.SandboxID = berth.AppRunning, []string{"sb-a", "sb-b"}[i]
			_, errs[i] = s.UpdateApp(ctx, w, "serving", "test", at(time.Second))
		})
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, berth.ErrStaleRevision):
			t.Fatalf("losing writer: %v; want ErrStaleRevision", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d writers won over the same revision; want exactly 1 (%v)", won, errs)
	}
	cur, err := s.App(ctx, "web")
	if err != nil || cur.Revision != 2 || cur.State != berth.AppRunning || !cur.UpdatedAt.Equal(at(time.Second)) {
		t.Fatalf("after the write: %+v, %v", cur, err)
	}
	// Same state: no event. Then a state change: one event.
	cur.LastActive = at(2 * time.Second)
	if cur, err = s.UpdateApp(ctx, cur, "touched", "test", at(2*time.Second)); err != nil || cur.Revision != 3 {
		t.Fatalf("touch: %+v, %v", cur, err)
	}
	cur.State = berth.AppWaitingCapacity
	if cur, err = s.UpdateApp(ctx, cur, "no_capacity: 1 host", "test", at(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateApp(ctx, berth.App{Name: "nope", Revision: 1, State: berth.AppRunning}, "", "test", T0); !errors.Is(err, berth.ErrNotFound) {
		t.Fatalf("update of an unknown app: %v; want ErrNotFound", err)
	}
	if err := s.DeleteApp(ctx, "web", 1, "test", T0); !errors.Is(err, berth.ErrStaleRevision) {
		t.Fatalf("delete over an old revision: %v; want ErrStaleRevision", err)
	}
	if err := s.DeleteApp(ctx, "web", cur.Revision, "test", at(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.App(ctx, "web"); !errors.Is(err, berth.ErrNotFound) {
		t.Fatalf("deleted app: %v", err)
	}
	evs, err := s.Events(ctx, berth.EventFilter{Entity: "app/web"})
	if err != nil {
		t.Fatal(err)
	}
	var story []string
	for _, e := range evs {
		story = append(story, e.From+"→"+e.To+": "+e.Reason)
	}
	want := []string{
		"→deploying: created (version 1, desired running)",
		"deploying→running: serving",
		"running→waiting_capacity: no_capacity: 1 host",
		"waiting_capacity→deleted: deleted by its owner",
	}
	if diff := cmp.Diff(want, story); diff != "" {
		t.Fatalf("app events (-want +got):\n%s", diff)
	}
	all, err := s.Apps(ctx, "")
	if err != nil || len(all) != 1 || all[0].Name != "api" {
		t.Fatalf("Apps(all): %+v, %v", all, err)
	}
	if mine, err := s.Apps(ctx, "acme"); err != nil || len(mine) != 0 {
		t.Fatalf("Apps(acme) after delete: %+v, %v", mine, err)
	}
}
