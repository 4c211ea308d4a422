package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/storetest"
)

// eventually calls f until it returns nil or storetest.WaitLimit passes (a hang guard, not a
// timing assertion) and returns the last error.
func eventually(f func() error) error {
	deadline := time.Now().Add(storetest.WaitLimit)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond) // real: PostgreSQL going down and coming back
	}
}

// TestOutage stops PostgreSQL under a running Store: every call returns an error (no panic)
// while it is down, and once it is back the same Store works again without reopening and a
// running WatchAgents has reconnected (fn("")) and delivers new changes.
func TestOutage(t *testing.T) {
	c := pgtest.StartPrivate(t)
	s := openURL(t, c.NewDatabase(t))
	ctx := t.Context()
	now := storetest.T0
	hb := berth.Heartbeat{AgentID: "a1", Status: berth.AgentActive, BootID: "b1", MemoryMiBAdmittable: 2048}
	if _, err := s.ApplyHeartbeat(ctx, hb, now); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	w := storetest.Watch(t, s)
	r := func(id string) berth.Reservation {
		return berth.Reservation{ID: id, AgentID: "a1", SandboxID: "sb-" + id, MiB: 512, Owner: "replica-1", CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	}

	c.Stop(t)
	calls := map[string]func() error{
		"Ping": func() error { return s.Ping(ctx) },
		"Reserve": func() error {
			took, err := s.Reserve(ctx, r("down"), now)
			if took {
				t.Errorf("Reserve while down took the reservation")
			}
			return err
		},
		"Agents":        func() error { _, err := s.Agents(ctx); return err },
		"SetAgentDrain": func() error { return s.SetAgentDrain(ctx, "a1", true, "ops", "admin/ops", now) },
		"ApplyHeartbeat": func() error {
			_, err := s.ApplyHeartbeat(ctx, hb, now)
			return err
		},
	}
	for name, call := range calls {
		for range 3 { // more calls than the pool holds dead connections
			if err := call(); err == nil {
				t.Errorf("%s while PostgreSQL is down: err = nil, want an error", name)
			}
		}
	}

	c.Start(t)
	if err := eventually(func() error { return s.Ping(ctx) }); err != nil {
		t.Fatalf("Ping after PostgreSQL is back: %v", err)
	}
	if took, err := s.Reserve(ctx, r("up"), now); err != nil || !took {
		t.Errorf("Reserve after PostgreSQL is back = %v, %v; want true, nil", took, err)
	}
	w.Next("") // reconnected: refresh everything
	if err := s.SetAgentDrain(ctx, "a1", true, "ops", "admin/ops", now); err != nil {
		t.Fatalf("SetAgentDrain after PostgreSQL is back: %v", err)
	}
	w.Next("a1")
}

// TestPingFailsWhenDown pins that Ping of a Store whose server is gone returns an error within
// the caller's deadline instead of hanging.
func TestPingFailsWhenDown(t *testing.T) {
	c := pgtest.StartPrivate(t)
	s := openURL(t, c.NewDatabase(t))
	c.Stop(t)
	ctx, cancel := context.WithTimeout(t.Context(), storetest.WaitLimit)
	defer cancel()
	if err := s.Ping(ctx); err == nil {
		t.Fatalf("Ping of a stopped server: err = nil")
	}
	if ctx.Err() != nil {
		t.Errorf("Ping returned only after the caller's deadline")
	}
}
