package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

// WaitLimit bounds every wait of the suite for something pushed (a WatchAgents call): a guard
// against hanging forever, not a performance assertion.
const WaitLimit = 30 * time.Second

// Watch runs w.WatchAgents until t ends, collecting every id passed to fn. It waits for the
// first call, fn(""), which says the watch is established, so changes made after Watch
// returns are seen.
func Watch(t *testing.T, w berth.AgentWatcher) *Watched {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	wd := &Watched{t: t, wake: make(chan struct{}, 1), done: make(chan error, 1), cancel: cancel}
	go func() { wd.done <- w.WatchAgents(ctx, wd.add) }()
	t.Cleanup(func() { wd.Stop() })
	wd.Next("")
	return wd
}

// Watched collects the calls of one WatchAgents.
type Watched struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan error
	wake   chan struct{}

	mu  sync.Mutex // guards ids
	ids []string

	stopMu  sync.Mutex // guards stopped and err; never held by fn
	stopped bool
	err     error
}

// add is the fn of WatchAgents: it never blocks.
func (w *Watched) add(id string) {
	w.mu.Lock()
	w.ids = append(w.ids, id)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Next waits (up to WaitLimit) for the next call of fn and fails the test unless its id is
// want.
func (w *Watched) Next(want string) {
	w.t.Helper()
	if got, ok := w.next(); !ok {
		w.t.Fatalf("WatchAgents: no call within %v, want fn(%q)", WaitLimit, want)
	} else if got != want {
		w.t.Errorf("WatchAgents: fn(%q), want fn(%q)", got, want)
	}
}

// next pops the oldest call, waiting up to WaitLimit for one.
func (w *Watched) next() (string, bool) {
	timeout := time.NewTimer(WaitLimit)
	defer timeout.Stop()
	for {
		w.mu.Lock()
		if len(w.ids) > 0 {
			id := w.ids[0]
			w.ids = w.ids[1:]
			w.mu.Unlock()
			return id, true
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-timeout.C:
			return "", false
		}
	}
}

// Stop cancels the watch and returns what WatchAgents returned; it fails the test unless that
// is context.Canceled or WatchAgents does not return within WaitLimit.
func (w *Watched) Stop() error {
	w.stopMu.Lock()
	defer w.stopMu.Unlock()
	if w.stopped {
		return w.err
	}
	w.stopped = true
	w.cancel()
	select {
	case w.err = <-w.done:
		if !errors.Is(w.err, context.Canceled) {
			w.t.Errorf("WatchAgents returned %v after its context was cancelled, want context.Canceled", w.err)
		}
	case <-time.After(WaitLimit):
		w.t.Errorf("WatchAgents did not return within %v of its context's end", WaitLimit)
	}
	return w.err
}

// testWatchAgents pins the push of PLC-5 for stores that implement berth.AgentWatcher: fn("")
// once the watch is established, then the agent id of every registration, status change and
// drain or undrain, in order, and nothing for writes that change neither. Since changes made
// one after another arrive in order, "nothing" is proven by the next change arriving first.
func testWatchAgents(t *testing.T, s berth.Store) {
	aw, ok := s.(berth.AgentWatcher)
	if !ok {
		t.Skip("store does not implement berth.AgentWatcher")
	}
	ctx := t.Context()
	w := Watch(t, aw)
	drain := func(id string, on bool, when time.Duration) {
		t.Helper()
		if err := s.SetAgentDrain(ctx, id, on, "ops", "admin/ops", at(when)); err != nil {
			t.Fatalf("SetAgentDrain(%s, %v): %v", id, on, err)
		}
	}
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	w.Next("a1") // registered
	mustHeartbeat(t, s, heartbeat("a2", 2048), T0)
	w.Next("a2")
	mustHeartbeat(t, s, heartbeat("a1", 1024), at(time.Second)) // same status: nothing
	drain("a1", true, 2*time.Second)
	w.Next("a1")
	drain("a1", true, 3*time.Second) // already drained: nothing
	self := heartbeat("a1", 2048)
	self.Status = berth.AgentDraining // drains itself while drained: status stays draining
	mustHeartbeat(t, s, self, at(4*time.Second))
	if err := s.SetAgentDrain(ctx, "ghost", true, "ops", "admin/ops", at(4*time.Second)); !errors.Is(err, berth.ErrNotFound) {
		t.Errorf("SetAgentDrain(ghost) = %v, want ErrNotFound", err)
	}
	drain("a2", true, 5*time.Second)
	w.Next("a2")
	drain("a1", false, 6*time.Second) // undrained, still draining on its own: drain state changed
	w.Next("a1")
	mustHeartbeat(t, s, heartbeat("a1", 2048), at(7*time.Second)) // draining → active
	w.Next("a1")
	drain("a2", false, 8*time.Second)
	w.Next("a2")

	// A second watcher sees the same changes from the moment it is established.
	w2 := Watch(t, aw)
	drain("a1", true, 9*time.Second)
	w.Next("a1")
	w2.Next("a1")
	if err := w.Stop(); !errors.Is(err, context.Canceled) {
		return
	}
	drain("a1", false, 10*time.Second)
	w2.Next("a1")
	a, err := s.Agent(ctx, "a1")
	if err != nil {
		t.Fatalf("Agent(a1): %v", err)
	}
	if diff := cmp.Diff(berth.AgentActive, a.Status); diff != "" {
		t.Errorf("a1 status (-want +got):\n%s", diff)
	}
}
