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
	if err != nil && !errors.Is(err, berth.ErrNotFound) && ctx.Err() == nil {
		s.log.Warn("app hibernation: reading its sandbox failed; the next round reads again", "app", a.Name, "sandbox", id, "err", err)
	}
	if err != nil || sb.State != berth.SandboxRunning {
		return // the next round sees what became of it
	}
	switched, err := s.commitApp(ctx, a.Name, "hibernate by pause", pauseSwitch(id, version, why))
	if err != nil {
		return
	}
	for _, old := range switched.Retire {
		s.retireSandbox(ctx, old, "app "+a.Name+" hibernated")
	}
	if _, _, err := s.checkpointSandbox(ctx, sb, []berth.SandboxState{berth.SandboxRunning}, berth.SandboxPausing,
		"app "+a.Name+" hibernates", s.appActor()); err != nil {
		s.log.Warn("app hibernation: pause failed; stopping its sandbox instead", "app", a.Name, "sandbox", id, "err", err)
		s.pauseFailed(ctx, a.Name, id, why)
		return
	}
	s.noteApp(ctx, a.Name, "record the pause", func(a *berth.App) error {
		if a.PausedSandbox != id || a.State != berth.AppHibernated {
			return errSuperseded
		}
		a.Reason = why + "; its sandbox " + id + " is paused, its memory kept: the next request resumes it"
		return nil
	})
	s.kickApps()
}

// pauseSwitch switches an app to hibernated with sandbox id (running version) as its paused
// sandbox, unless it was woken or changed meanwhile; a paused sandbox it had is retired.
func pauseSwitch(id string, version int, why string) func(a *berth.App) error {
	return func(a *berth.App) error {
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
	}
}

// pauseFailed stops sandbox id of app name, whose pause failed, unless the app was woken
// meanwhile (the wake serves from it).
func (s *Server) pauseFailed(ctx context.Context, name, id, why string) {
	if s.noteApp(ctx, name, "record a failed pause", func(a *berth.App) error {
		if a.Desired != berth.DesireHibernated || a.PausedSandbox != id {
			return errSuperseded // woken meanwhile: the wake serves from it
		}
		a.PausedSandbox, a.PausedVersion = "", 0
		a.Reason = why + "; its sandbox could not be paused, so it was stopped"
		return nil
	}) {
		s.retireSandbox(ctx, id, "app "+name+" hibernated (its pause failed)")
	}
	s.kickApps()
}

// A wake from a paused sandbox (decideWake): a paused sandbox is resumed like a create (a
// refusal puts the app in waiting_capacity, APP-2); one still pausing is waited for; one
// running again (its pause failed) serves at once; every resumed one must answer on its port
// before it serves. One that is gone or of an older version is forgotten, and the next step
// starts a fresh sandbox.

// resumePaused resumes a's paused sandbox sb and serves from it (servePaused). It returns
// the app and true when the sandbox was forgotten (it ended): the next step starts anew.
func (s *Server) resumePaused(ctx context.Context, a berth.App, sb berth.Sandbox) (berth.App, bool) {
	placed, err := s.resume(ctx, sb, []berth.SandboxState{berth.SandboxPaused}, s.appActor())
	var e *berth.Error
	switch {
	case err == nil:
		return s.servePaused(ctx, a, placed)
	case errors.As(err, &e) && e.Retryable():
		s.waitCapacity(ctx, a, e)
		return a, false
	}
	cur, rerr := s.store.Sandbox(ctx, sb.ID)
	if rerr == nil && cur.State.Terminal() {
		return s.forgetPaused(ctx, a, fmt.Sprintf("its paused sandbox could not be resumed (%s): starting a new one", berth.ErrorMessage(err)))
	}
	s.log.Warn("app wake: resume failed; will retry", "app", a.Name, "sandbox", sb.ID, "err", err, "read_err", rerr)
	return a, false
}

// servePaused waits until a's resumed (or never paused) sandbox sb answers on the app's port
// and switches the app to it; one that does not answer is forgotten (true: start anew).
func (s *Server) servePaused(ctx context.Context, a berth.App, sb berth.Sandbox) (berth.App, bool) {
	addr, err := s.agentAddress(ctx, sb.AgentID)
	if err == nil {
		err = s.waitServing(ctx, addr, sb.ID, a)
	}
	if err != nil {
		return s.forgetPaused(ctx, a, fmt.Sprintf("its resumed sandbox did not answer on port %d (%s): starting a new one", a.Spec.Port, berth.ErrorMessage(err)))
	}
	s.switchApp(ctx, a, sb, a.PausedVersion)
	return a, false
}

// forgetPaused retires a's paused sandbox, which will not serve (gone, of an older version,
// or silent), with reason. It returns the app as written and true when it was (the next
// step starts a fresh sandbox); false when the app changed, or the store failed (logged).
func (s *Server) forgetPaused(ctx context.Context, a berth.App, reason string) (berth.App, bool) {
	id := a.PausedSandbox
	updated, err := s.commitApp(ctx, a.Name, "forget its paused sandbox", func(a *berth.App) error {
		if a.PausedSandbox != id {
			return errSuperseded
		}
		a.Retire = append(a.Retire, id)
		a.PausedSandbox, a.PausedVersion = "", 0
		a.Reason = reason
		return nil
	})
	if err != nil {
		return a, false
	}
	s.retireSandbox(ctx, id, "app "+a.Name+": "+reason)
	return updated, true
}
