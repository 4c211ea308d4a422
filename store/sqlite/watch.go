package sqlite

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/berth-dev/berth"
)

var _ berth.AgentWatcher = (*Store)(nil)

// watchBuffer is how many agent changes a watcher may fall behind before they are replaced by
// one fn("") (refresh everything).
const watchBuffer = 256

// watchers fans agent changes out to the WatchAgents calls of one Store. A SQLite database has
// one writer process, so an in-memory fan-out fed after each commit reaches every watcher.
type watchers struct {
	mu   sync.Mutex
	next int
	subs map[int]*watcher
}

// watcher is one WatchAgents call: its queue and whether it overflowed.
type watcher struct {
	ch     chan string
	missed atomic.Bool
}

// notify queues agent id for every watcher; a full queue records a miss instead of blocking.
func (w *watchers) notify(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, sub := range w.subs {
		select {
		case sub.ch <- id:
		default:
			sub.missed.Store(true)
		}
	}
}

// WatchAgents implements berth.AgentWatcher (PLC-5) for one process: it calls fn with the id
// of every agent whose drain state or status changed through this Store (SetAgentDrain, or
// ApplyHeartbeat registering an agent or changing its status), after the change committed,
// from one goroutine, until ctx ends; then it returns ctx.Err().
//
// It calls fn("") first, once the watch is established, and again whenever fn fell more than
// 256 changes behind: "" means "changes may have been missed; re-read every agent" (the same
// convention as store/postgres, whose fn("") follows each reconnect). fn must not block.
func (s *Store) WatchAgents(ctx context.Context, fn func(agentID string)) error {
	sub := &watcher{ch: make(chan string, watchBuffer)}
	s.watch.mu.Lock()
	if s.watch.subs == nil {
		s.watch.subs = map[int]*watcher{}
	}
	key := s.watch.next
	s.watch.next++
	s.watch.subs[key] = sub
	s.watch.mu.Unlock()
	defer func() {
		s.watch.mu.Lock()
		delete(s.watch.subs, key)
		s.watch.mu.Unlock()
	}()
	fn("")
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case id := <-sub.ch:
			if sub.missed.Swap(false) {
				fn("")
				continue
			}
			fn(id)
		}
	}
}
