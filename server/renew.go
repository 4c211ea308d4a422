package server

import (
	"context"
	"sync"
	"time"

	"github.com/berth-dev/berth"
)

// renewal keeps one reservation alive while its create is in flight (C31, LED-2).
type renewal struct {
	res  berth.Reservation // its expiry as the renewals left it; read after done
	once sync.Once
	quit chan struct{}
	done chan struct{}
}

// renewEvery is how often a reservation is renewed while its create is in flight: a third of
// its TTL, so two renewals in a row may fail or run late before it lapses.
func renewEvery(ttl time.Duration) time.Duration { return max(ttl/3, 10*time.Millisecond) }

// keepReserved renews reservation res every third of the reservation TTL, each time to a full
// TTL from the server's now, until stop is called (C31: a create slower than the TTL must not
// let the sweeper, or the next Reserve's fits check, hand its room to another create while
// the agent is still starting it). The loop is bounded in time: it ends by itself after
// AgentTimeout + 2×ReservationTTL, longer than any create can be in flight (the agent call
// is cut at AgentTimeout), and once the store says the reservation is gone (netted by a
// heartbeat that lists the sandbox, released, or lapsed). Each renewal is bounded by the
// renewal period (within [1 s, 5 s]).
func (s *scheduler) keepReserved(res berth.Reservation) *renewal {
	r := &renewal{res: res, quit: make(chan struct{}), done: make(chan struct{})}
	every := renewEvery(s.cfg.ReservationTTL)
	go func() {
		defer close(r.done)
		t := time.NewTicker(every)
		defer t.Stop()
		limit := time.NewTimer(s.cfg.AgentTimeout + 2*s.cfg.ReservationTTL)
		defer limit.Stop()
		for {
			select {
			case <-r.quit:
				return
			case <-limit.C:
				s.cfg.Logger.Warn("stopped renewing a reservation: its create has outlived AgentTimeout", "reservation", res.ID)
				return
			case <-t.C:
			}
			if !s.renew(&r.res, every) {
				return
			}
		}
	}()
	return r
}

// renew moves res's expiry to a full TTL from now (res.ExpiresAt follows) and reports
// whether res is still held. A store error counts as held (the next tick tries again). The
// call is bounded by timeout, within [1 s, 5 s]: a release waits for a renewal in progress.
func (s *scheduler) renew(res *berth.Reservation, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), min(max(timeout, time.Second), 5*time.Second))
	defer cancel()
	now := s.cfg.Clock()
	to := now.Add(s.cfg.ReservationTTL)
	ok, err := s.store.Renew(ctx, res.ID, to, now)
	switch {
	case err != nil:
		s.cfg.Logger.Warn("could not renew a reservation; retrying", "reservation", res.ID, "err", err)
		return true
	case ok:
		if to.After(res.ExpiresAt) {
			res.ExpiresAt = to
		}
	case now.Before(res.ExpiresAt):
		// Gone before its time: netted by a heartbeat that lists the sandbox (LED-4), the
		// usual end of a slow start, or released.
		s.cfg.Logger.Debug("reservation taken over while its create is in flight", "reservation", res.ID, "sandbox", res.SandboxID)
	default:
		s.cfg.Logger.Warn("reservation lapsed while its create is in flight: the store did not take its renewals in time",
			"reservation", res.ID, "agent", res.AgentID, "sandbox", res.SandboxID)
	}
	return ok
}

// stop ends the renewals and waits for a renewal in progress to finish, so none lands after
// a release; it is idempotent.
func (r *renewal) stop() {
	r.once.Do(func() { close(r.quit) })
	<-r.done
}

// afterCreate stops the renewals of a create that succeeded. The agent lists the sandbox on
// its next heartbeat, which nets the reservation (LED-4); until then the reservation must
// keep counting it. The renewals leave at least two thirds of the TTL (Config.Validate: at
// least two heartbeat periods), so that is almost always so already; only when less than one
// and a half heartbeat periods are left (renewals that failed, a tight configuration) is it
// renewed once more, to a full TTL — the usual create pays no extra write.
func (s *scheduler) afterCreate(r *renewal) {
	r.stop()
	if r.res.ExpiresAt.Sub(s.cfg.Clock()) < s.cfg.HeartbeatInterval*3/2 {
		s.renew(&r.res, time.Second)
	}
}
