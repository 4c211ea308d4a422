package driver

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/berth-dev/berth"
)

// TestValidID: ids are safe as a path element, a container id and a cgroup name.
func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{
		"sb-1": true, "sbx_01HZ.v2": true, "": false, ".": false, "..": false,
		"a/b": false, "a b": false, "ü": false, string(make([]byte, 129)): false,
	} {
		if err := ValidID(id); (err == nil) != ok {
			t.Errorf("ValidID(%q) = %v, want ok %t", id, err, ok)
		}
	}
}

type rec struct {
	Life
	n int
}

// TestRegistryLifecycle: a Get during a start waits for it; concurrent Stops run one
// teardown and all get its error; a failed start runs its undo and frees the id; Close
// stops what is left and refuses new starts.
func TestRegistryLifecycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		r := NewRegistry[*rec]("test")
		a := &rec{Life: NewLife(), n: 1}
		if err := r.Admit("a", a); err != nil {
			t.Fatal(err)
		}
		if err := r.Admit("a", &rec{Life: NewLife()}); berth.ErrorCode(err) != berth.EConflict {
			t.Fatalf("second Admit of a: %v, want conflict", err)
		}
		got := make(chan int, 1)
		go func() {
			sb, err := r.Get(ctx, "a")
			if err != nil {
				t.Errorf("Get: %v", err)
			}
			got <- sb.n
		}()
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("Get returned before the start finished")
		}
		r.Started("a", a, nil, func() { t.Error("undo of a successful start") })
		if n := <-got; n != 1 {
			t.Fatalf("Get = %d", n)
		}

		teardowns := 0
		release := make(chan struct{})
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() {
				err := r.Stop(ctx, "a", func(*rec) error { teardowns++; <-release; return errors.New("boom") })
				if err == nil || err.Error() != "boom" {
					t.Errorf("Stop = %v, want the teardown's error", err)
				}
			})
		}
		synctest.Wait() // every Stop is in: one tears down, the others wait for it
		close(release)
		wg.Wait()
		if teardowns != 1 {
			t.Fatalf("%d teardowns, want 1", teardowns)
		}
		if _, ok := r.Peek("a"); ok {
			t.Fatal("a still registered after its stop")
		}

		b := &rec{Life: NewLife()}
		if err := r.Admit("b", b); err != nil {
			t.Fatal(err)
		}
		undone := false
		if err := r.Started("b", b, errors.New("no"), func() { undone = true }); err == nil || !undone {
			t.Fatalf("failed start: %v, undone %t", err, undone)
		}
		if _, err := r.Get(ctx, "b"); berth.ErrorCode(err) != berth.ESandboxNotFound {
			t.Fatalf("Get of a failed start: %v, want sandbox_not_found", err)
		}
		b2 := &rec{Life: NewLife()}
		if err := r.Admit("b", b2); err != nil {
			t.Fatalf("the id of a failed start is not free: %v", err)
		}
		r.Started("b", b2, nil, nil)

		c := &rec{Life: NewLife()}
		r.Admit("c", c)
		r.Started("c", c, nil, nil)
		stopped := map[string]bool{}
		var mu sync.Mutex
		first, err := r.Close(func(ctx context.Context, id string) error {
			mu.Lock()
			stopped[id] = true
			mu.Unlock()
			return r.Stop(ctx, id, func(*rec) error { return nil })
		})
		if !first || err != nil || !stopped["b"] || !stopped["c"] {
			t.Fatalf("Close = %t, %v, stopped %v", first, err, stopped)
		}
		if again, _ := r.Close(func(context.Context, string) error { return nil }); again {
			t.Fatal("a second Close says it was the first")
		}
		if err := r.Admit("d", &rec{Life: NewLife()}); berth.ErrorCode(err) != berth.EUnavailable {
			t.Fatalf("Admit after Close: %v, want unavailable", err)
		}
	})
}
