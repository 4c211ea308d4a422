package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// AgentsChannel is the LISTEN/NOTIFY channel of agent changes (PLC-5); the payload is the
// agent id.
const AgentsChannel = "berth_agents"

const (
	// watchMinBackoff and watchMaxBackoff bound the wait between reconnects of WatchAgents;
	// the wait doubles after each failed attempt and starts over once a LISTEN succeeds.
	watchMinBackoff = 50 * time.Millisecond
	watchMaxBackoff = 2 * time.Second
	// watchIdleCheck is how long a silent listening connection waits before it pings the
	// server, so a connection that died without a word (a network partition) is replaced.
	watchIdleCheck = 15 * time.Second
)

// WatchAgents implements berth.AgentWatcher (PLC-5) with LISTEN/NOTIFY: it calls fn with the
// id of every agent whose drain state or status changed through any Store on this database
// (SetAgentDrain, or ApplyHeartbeat registering an agent or changing its status), in commit
// order, from one goroutine, until ctx ends; then it returns ctx.Err().
//
// It holds a dedicated connection (outside the pool) and calls fn("") each time its LISTEN
// is (re)established, the first time included: "" means "changes before this point may have
// been missed; re-read every agent". On any connection error it reconnects by itself, waiting
// 50 ms doubling to 2 s between attempts. fn must not block: it runs on the receive loop.
func (s *Store) WatchAgents(ctx context.Context, fn func(agentID string)) error {
	backoff := watchMinBackoff
	for {
		if s.listen(ctx, fn) {
			backoff = watchMinBackoff
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, watchMaxBackoff)
	}
}

// listen runs one connection of WatchAgents until it fails or ctx ends, and reports whether
// its LISTEN succeeded.
func (s *Store) listen(ctx context.Context, fn func(agentID string)) (subscribed bool) {
	conn, err := pgx.ConnectConfig(ctx, s.conn.Copy())
	if err != nil {
		return false
	}
	defer closeConn(conn)
	if _, err := conn.Exec(ctx, "LISTEN "+AgentsChannel); err != nil {
		return false
	}
	fn("")
	for {
		wait, cancel := context.WithTimeout(ctx, watchIdleCheck)
		n, err := conn.WaitForNotification(wait)
		idle := wait.Err() != nil
		cancel()
		switch {
		case err == nil:
			fn(n.Payload)
		case ctx.Err() != nil:
			return true
		case !idle || conn.IsClosed():
			return true
		default:
			ping, cancel := context.WithTimeout(ctx, pingTimeout)
			err := conn.Ping(ping)
			cancel()
			if err != nil {
				return true
			}
		}
	}
}
