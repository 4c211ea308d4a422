package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/berth-dev/berth"
)

// The app reconciler's effect step: applyApp carries out the action decide
// chose, and every write it makes goes through commitApp, which never drops a store error.
// The writes themselves are functions of the app record (markLost, settleAt, hibernateIdle,
// markRunning): each re-checks the premise the decision saw and returns errSuperseded when
// the app changed under it.

// applyApp carries out act for a. It returns the app as the step left it and whether to
// decide again at once: the step changed what the next decision reads.
func (s *Server) applyApp(ctx context.Context, a berth.App, act appAction) (berth.App, bool) {
	switch act.Kind {
	case actRetire:
		return s.retireDue(ctx, a)
	case actLost:
		updated, err := s.commitApp(ctx, a.Name, "record its lost sandbox", markLost(act.Gone, act.Reason))
		return updated, err == nil
	case actForget:
		return s.forgetPaused(ctx, a, act.Reason)
	case actResume:
		return s.resumePaused(ctx, a, act.Sandbox)
	case actServePaused:
		return s.servePaused(ctx, a, act.Sandbox)
	case actPause:
		s.pauseApp(ctx, a, act.Reason)
	case actSettle:
		s.settle(ctx, a.Name, settleAt(act.Target, act.Reason))
	case actIdle:
		s.settle(ctx, a.Name, hibernateIdle(act.LastActive, act.Idle))
	case actMarkRunning:
		s.noteApp(ctx, a.Name, "record running", markRunning)
	case actStart:
		s.startApp(ctx, a)
	}
	return a, false // actNone, actWait: the next round decides again
}

// retireDue stops the sandboxes on a's retire list (their grace has passed) and drops them
// from the list.
func (s *Server) retireDue(ctx context.Context, a berth.App) (berth.App, bool) {
	var done []string
	for _, id := range a.Retire {
		if s.retireSandbox(ctx, id, "app "+a.Name+" no longer uses it") {
			done = append(done, id)
		}
	}
	if len(done) == 0 {
		return a, false // the store failed (logged): the next round tries again
	}
	updated, err := s.commitApp(ctx, a.Name, "drop retired sandboxes", func(a *berth.App) error {
		a.Retire = slices.DeleteFunc(a.Retire, func(id string) bool { return slices.Contains(done, id) })
		return nil
	})
	return updated, err == nil && len(done) == len(a.Retire)
}

// markLost records that gone, the serving sandbox, ended (what: what became of it): the app
// wakes elsewhere under a new incarnation.
func markLost(gone, what string) func(a *berth.App) error {
	return func(a *berth.App) error {
		if a.SandboxID != gone {
			return errSuperseded
		}
		a.SandboxID, a.AgentID, a.ServingVersion = "", "", 0
		a.Incarnation++
		a.State = berth.AppWaking
		a.Reason = fmt.Sprintf("%s: reconstructing version %d elsewhere", what, a.Version)
		return nil
	}
}

// settleAt moves an app to target (hibernated or stopped) without a sandbox; a stopped app
// also retires its paused sandbox (it keeps no memory).
func settleAt(target berth.AppState, why string) func(a *berth.App) error {
	return func(a *berth.App) error {
		if a.Desired == berth.DesireRunning {
			return errSuperseded
		}
		unserve(a)
		if a.Desired == berth.DesireStopped && a.PausedSandbox != "" {
			a.Retire = append(a.Retire, a.PausedSandbox)
			a.PausedSandbox, a.PausedVersion = "", 0
		}
		resetStart(a)
		a.State, a.Reason = target, why
		return nil
	}
}

// hibernateIdle sets desired hibernated after idle without a request (C25), unless the app
// changed or had activity after recorded, the last activity the decision saw. Only desired:
// the hibernation itself (a pause where the runtime can checkpoint, else a stop) is the next
// round's, run at once.
func hibernateIdle(recorded time.Time, idle time.Duration) func(a *berth.App) error {
	return func(a *berth.App) error {
		if a.State != berth.AppRunning || a.Desired != berth.DesireRunning || a.LastActive.After(recorded) {
			return errSuperseded
		}
		a.Desired = berth.DesireHibernated
		a.Reason = fmt.Sprintf("no request open or ended for %s (idle_seconds %d): hibernated", idle.Round(time.Second), a.IdleSeconds)
		return nil
	}
}

// markRunning records running for an app whose serving sandbox already runs its version
// (e.g. a deploy of a version that was already serving; nothing to start).
func markRunning(a *berth.App) error {
	if a.SandboxID == "" || a.ServingVersion != a.Version || a.State == berth.AppRunning {
		return errSuperseded
	}
	a.State, a.Reason = berth.AppRunning, fmt.Sprintf("serving version %d from sandbox %s", a.Version, a.SandboxID)
	return nil
}

// appStoreTries bounds the tries of one reconciler write that the store fails.
const appStoreTries = 4

// commitApp writes fn's change to app name (mutateApp) for step what of the reconciler. A
// store error is never dropped: each is logged and the write tried again after a full-jitter
// wait in the shared backoff window (berth.Backoff over AppBackoffBase..AppBackoffCap, SDK-1),
// up to appStoreTries tries while ctx lasts; the last error is returned, and the next round
// decides again. errSuperseded (fn found its premise gone) and ErrNotFound (the app was
// deleted) are answers, not faults: returned at once.
func (s *Server) commitApp(ctx context.Context, name, what string, fn func(a *berth.App) error) (berth.App, error) {
	for try := 0; ; try++ {
		a, err := s.mutateApp(ctx, name, s.appActor(), fn)
		if err == nil || errors.Is(err, errSuperseded) || errors.Is(err, berth.ErrNotFound) || ctx.Err() != nil {
			return a, err
		}
		last := try+1 >= appStoreTries
		s.log.Warn("app reconciler: store write failed", "app", name, "step", what, "try", try+1, "giving_up", last, "err", err)
		if last {
			return a, err
		}
		select {
		case <-ctx.Done():
			return a, err
		case <-time.After(rand.N(berth.Backoff(try, s.cfg.AppBackoffBase, s.cfg.AppBackoffCap))):
		}
	}
}

// noteApp is commitApp for a step whose caller goes no further either way; it reports
// whether the write happened (a store error is logged by commitApp).
func (s *Server) noteApp(ctx context.Context, name, what string, fn func(a *berth.App) error) bool {
	_, err := s.commitApp(ctx, name, what, fn)
	return err == nil
}
