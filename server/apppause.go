package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/berth-dev/berth"
)

// Apps whose runtime can checkpoint hibernate by pausing their sandbox and wake by resuming
// it (PAUSE-2): a woken app keeps its memory — caches, sessions, a warmed-up interpreter —
// instead of starting over. Apps on a runtime that cannot checkpoint stop and start as
// before.

// pauseApp hibernates app a by pausing its serving sandbox. The app is switched first —
// hibernated, no longer serving, PausedSandbox naming the sandbox — so a wake that arrives
// during the checkpoint finds the sandbox (pausing: it waits; running again after a failed
// checkpoint: it serves from it at once). If the checkpoint fails and the app is still to
// stay hibernated, the sandbox is stopped: hibernation never keeps a sandbox running.
func (s *Server) pauseApp(ctx context.Context, a berth.App, why string) {
	id, version := a.SandboxID, a.ServingVersion
	sb, err := s.store.Sandbox(ctx, id)
	if err != nil || sb.State != berth.SandboxRunning {
		return // the next round sees what became of it
	}
	switched, err := s.mutateApp(ctx, a.Name, s.appActor(), func(a *berth.App) error {
		if a.Desired != berth.DesireHibernated || a.SandboxID != id {
			return errSuperseded
		}
		if a.PausedSandbox != "" && a.PausedSandbox != id {
			a.Retire = append(a.Retire, a.PausedSandbox)
		}
		a.SandboxID, a.AgentID, a.ServingVersion = "", "", 0
		a.PausedSandbox, a.PausedVersion = id, version
		resetStart(a)
		a.State, a.Reason = berth.AppHibernated, why+"; pausing its sandbox "+id+" (its memory is kept)"
		return nil
	})
	if err != nil {
		return
	}
	for _, old := range switched.Retire {
		s.retireSandbox(ctx, old, "app "+a.Name+" hibernated")
	}
	if _, _, err := s.checkpointSandbox(ctx, sb, []berth.SandboxState{berth.SandboxRunning}, berth.SandboxPausing,
		"app "+a.Name+" hibernates", s.appActor()); err == nil {
		_, _ = s.mutateApp(ctx, a.Name, s.appActor(), func(a *berth.App) error {
			if a.PausedSandbox != id || a.State != berth.AppHibernated {
				return errSuperseded
			}
			a.Reason = why + "; its sandbox " + id + " is paused, its memory kept: the next request resumes it"
			return nil
		})
		s.kickApps()
		return
	} else {
		s.log.Warn("app hibernation: pause failed; stopping its sandbox instead", "app", a.Name, "sandbox", id, "err", err)
	}
	_, err = s.mutateApp(ctx, a.Name, s.appActor(), func(a *berth.App) error {
		if a.Desired != berth.DesireHibernated || a.PausedSandbox != id {
			return errSuperseded // woken meanwhile: the wake serves from it
		}
		a.PausedSandbox, a.PausedVersion = "", 0
		a.Reason = why + "; its sandbox could not be paused, so it was stopped"
		return nil
	})
	if err == nil {
		s.retireSandbox(ctx, id, "app "+a.Name+" hibernated (its pause failed)")
	}
	s.kickApps()
}

// wakePaused brings back the sandbox a hibernated app was paused in (a.PausedSandbox) and
// reports whether the caller should start a fresh sandbox instead: the paused one is gone or
// of an older version. A paused sandbox is resumed like a create (a refusal puts the app in
// waiting_capacity, APP-2); one still pausing is waited for; one running again (its pause
// failed) serves at once; every resumed one must answer on its port before it serves.
func (s *Server) wakePaused(ctx context.Context, a berth.App) (startFresh bool) {
	id := a.PausedSandbox
	forget := func(reason string) bool {
		_, err := s.mutateApp(ctx, a.Name, s.appActor(), func(a *berth.App) error {
			if a.PausedSandbox != id {
				return errSuperseded
			}
			a.Retire = append(a.Retire, id)
			a.PausedSandbox, a.PausedVersion = "", 0
			a.Reason = reason
			return nil
		})
		if err == nil {
			s.retireSandbox(ctx, id, "app "+a.Name+": "+reason)
		}
		return err == nil
	}
	if a.PausedVersion != a.Version {
		return forget(fmt.Sprintf("version %d was deployed while it slept: starting it instead of resuming version %d", a.Version, a.PausedVersion))
	}
	sb, err := s.store.Sandbox(ctx, id)
	if err != nil {
		return false // the store is down; the next round tries again
	}
	switch {
	case sb.State == berth.SandboxPaused:
		if now := s.cfg.Clock(); now.Before(a.RetryAt) && !s.roomFor(ctx, a) {
			return false
		}
		placed, err := s.resume(ctx, sb, []berth.SandboxState{berth.SandboxPaused}, s.appActor())
		var e *berth.Error
		switch {
		case err == nil:
			sb = placed
		case errors.As(err, &e) && e.Retryable():
			s.waitCapacity(ctx, a, e)
			return false
		default:
			if cur, rerr := s.store.Sandbox(ctx, id); rerr == nil && cur.State.Terminal() {
				return forget(fmt.Sprintf("its paused sandbox could not be resumed (%s): starting a new one", berth.ErrorMessage(err)))
			}
			s.log.Warn("app wake: resume failed; will retry", "app", a.Name, "sandbox", id, "err", err)
			return false
		}
	case sb.State == berth.SandboxRunning:
		// Its pause failed and it runs on: serve from it.
	case sb.State.Terminal():
		return forget(fmt.Sprintf("its paused sandbox %s (%s): starting a new one", sb.State, sb.Reason))
	default:
		return false // pausing, resuming: the next round sees the outcome
	}
	addr, err := s.agentAddress(ctx, sb.AgentID)
	if err == nil {
		err = s.waitServing(ctx, addr, sb.ID, a)
	}
	if err != nil {
		return forget(fmt.Sprintf("its resumed sandbox did not answer on port %d (%s): starting a new one", a.Spec.Port, berth.ErrorMessage(err)))
	}
	s.switchApp(ctx, a, sb, a.PausedVersion)
	return false
}
