package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/placement"
)

// The app reconciler (APP-2) drives every app's actual state toward its desired state
// through the normal scheduler. Each replica runs it; they agree through the store: every
// write is a compare-and-set on the app's revision, and a start's sandbox carries an
// Idempotency-Key made of the app's version and incarnation, so two replicas starting the
// same app get the same sandbox.
//
// A capacity refusal (any retryable code, and tenant_over_quota, which frees up the same way)
// puts the app in waiting_capacity and schedules the next try after the server's Retry-After
// plus a full-jitter backoff (SDK-1's window); it never makes the app error. error is only
// for what a retry cannot fix: a template gone, or a command that exits before it answers on
// its port on AppStartFailures starts in a row.

// errSuperseded stops a mutation whose premise no longer holds (the app changed under it).
var errSuperseded = errors.New("app changed: decision superseded")

// runApps reconciles every app each AppReconcileInterval, and at once when kicked, until
// ctx ends. An app is worked on by one goroutine at a time per replica.
func (s *Server) runApps(ctx context.Context) {
	t := time.NewTicker(s.cfg.AppReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.appKick:
		}
		apps, err := s.store.Apps(ctx, "")
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("app reconciler: list apps failed", "err", err)
			}
			continue
		}
		for _, a := range apps {
			if _, busy := s.appBusy.LoadOrStore(a.Name, true); busy {
				continue
			}
			go func() {
				defer s.appBusy.Delete(a.Name)
				s.reconcileApp(ctx, a)
				s.appDone.Add(1)
			}()
		}
	}
}

// kickApps makes the reconciler run a round now (without blocking).
func (s *Server) kickApps() {
	select {
	case s.appKick <- struct{}{}:
	default:
	}
}

// appStepsPerRound bounds the steps one round takes for an app. A step that changes what the
// next decision reads (a retire, a lost sandbox, a paused sandbox forgotten) is followed at
// once by the next; the longest chain is retire, lost, forget, retire, start.
const appStepsPerRound = 6

// reconcileApp takes a's steps for this round (a read at the start of the round, or since if
// this replica wrote it after that read: appAsOfNow; every write re-reads): observe what the
// decision needs, decide (pure), apply, and again while a step asks for the next at once.
func (s *Server) reconcileApp(ctx context.Context, a berth.App) {
	a, ok := s.appAsOfNow(ctx, a)
	if !ok {
		return
	}
	s.noteIdle(a.Name, a.IdleSeconds) // for the requests open here (C25)
	for range appStepsPerRound {
		now := s.cfg.Clock()
		act := decide(a, s.observeApp(ctx, a, now), now)
		next, again := s.applyApp(ctx, a, act)
		if !again {
			return
		}
		a = next
	}
}

// observeApp reads what decide needs for a at now: the serving sandbox (desired running),
// the paused one (a wake of its version), whether its host can checkpoint (a hibernation),
// this replica's activity (C25) and, only when a retry is pending, whether a host has room.
func (s *Server) observeApp(ctx context.Context, a berth.App, now time.Time) appFacts {
	f := appFacts{OpenHere: s.appOpenHere(a.Name)}
	if v, ok := s.appSeen.Load(a.Name); ok {
		f.SeenHere = v.(time.Time)
	}
	running := a.Desired == berth.DesireRunning
	if a.SandboxID != "" && a.Desired == berth.DesireHibernated {
		f.CanCheckpoint = s.sched.canCheckpoint(a.AgentID)
	}
	if a.SandboxID != "" && running {
		f.Serving = s.viewSandbox(ctx, a.Name, a.SandboxID)
	}
	if running && a.SandboxID == "" && a.PausedSandbox != "" && a.PausedVersion == a.Version && a.State != berth.AppError {
		f.Paused = s.viewSandbox(ctx, a.Name, a.PausedSandbox)
	}
	f.Room = needsRoom(a, now) && s.roomFor(ctx, a)
	return f
}

// viewSandbox reads sandbox id for a step of app name. A store error is logged, never
// dropped; the step then waits (sbUnreadable) and the next round reads again.
func (s *Server) viewSandbox(ctx context.Context, name, id string) sbView {
	sb, err := s.store.Sandbox(ctx, id)
	switch {
	case err == nil:
		return sbView{Seen: sbFound, Sandbox: sb}
	case errors.Is(err, berth.ErrNotFound):
		return sbView{Seen: sbMissing}
	}
	if ctx.Err() == nil {
		s.log.Warn("app reconciler: reading a sandbox failed; the next round reads again", "app", name, "sandbox", id, "err", err)
	}
	return sbView{Seen: sbUnreadable}
}

// roomFor reports whether this replica's snapshot shows a host that would take a's sandbox
// now. Retry-After is the scheduler's estimate of when room frees; a waiting app does not
// sit out the rest of it once a heartbeat shows room (a sandbox deleted, a host added): the
// check costs no I/O beyond the snapshot's usual refresh.
func (s *Server) roomFor(ctx context.Context, a berth.App) bool {
	t, err := s.templates.get(ctx, a.Spec.Template)
	if err == nil {
		err = s.sched.refreshIfStale(ctx)
	}
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, berth.ErrNotFound) { // a missing template is startApp's to record
			s.log.Warn("app reconciler: cannot tell whether a host has room; waiting for the retry time", "app", a.Name, "err", err)
		}
		return false
	}
	d, _, _ := s.sched.pick(placement.Request{MemoryMiB: berth.SandboxMiB(a.Spec.MemoryMiB, t.MemoryMiB)}, nil)
	return d.Index >= 0
}

// startApp places a sandbox for a's current version, sets it up (files, then the command),
// waits until it answers on its port and switches the app to it (switchApp); the sandbox it
// replaces is retired. Refusals and failures are recorded on the app (APP-2).
func (s *Server) startApp(ctx context.Context, a berth.App) {
	placed, ok := s.placeApp(ctx, a)
	if !ok {
		return
	}
	addr, err := s.agentAddress(ctx, placed.AgentID)
	if err == nil {
		err = s.setUpApp(ctx, addr, placed.ID, a)
	}
	if errors.Is(err, errSuperseded) {
		s.retireSandbox(ctx, placed.ID, "app "+a.Name+" was deleted or changed while this start set up")
		return
	}
	if err != nil {
		s.retireSandbox(ctx, placed.ID, "app "+a.Name+" set-up failed: "+err.Error())
		code := berth.ErrorCode(err)
		if code == berth.EInvalidRequest || code == berth.ETooLarge {
			// The agent refused the spec itself (a file or an env it cannot take): every start
			// would be refused alike, so it is the app's error at once, as a placement's
			// invalid_request is (startRefused) — not a transient start to retry for ever.
			s.failApp(ctx, a, fmt.Sprintf("version %d cannot start: the agent refused its set-up (%v); deploy a fixed spec", a.Version, err))
			return
		}
		// The command exiting, or running without ever answering on the port, is the app's
		// own fault and repeats; anything else (agent unreachable, sandbox gone) is transient.
		s.startFailed(ctx, a, code == berth.EServiceExited || code == berth.EUpstream, err)
		return
	}
	s.switchApp(ctx, a, placed, a.Version)
}

// placeApp creates a's sandbox through the scheduler, under the start's Idempotency-Key (or
// finds the one a replica created under it). ok is false when there is nothing to set up:
// the refusal or fault is then recorded on the app (APP-2).
func (s *Server) placeApp(ctx context.Context, a berth.App) (_ berth.Sandbox, ok bool) {
	t, err := s.templates.get(ctx, a.Spec.Template)
	if errors.Is(err, berth.ErrNotFound) {
		s.failApp(ctx, a, fmt.Sprintf("template %q no longer exists: deploy a version with another template", a.Spec.Template))
		return berth.Sandbox{}, false
	}
	if err != nil {
		s.log.Warn("app start: reading its template failed; the next round tries again", "app", a.Name, "err", err)
		return berth.Sandbox{}, false
	}
	now := s.cfg.Clock().UTC()
	sb := berth.Sandbox{
		ID: newID("sb"), Template: t.Name, Tenant: a.Tenant,
		MemoryMiB: berth.SandboxMiB(a.Spec.MemoryMiB, t.MemoryMiB), VCPUs: t.VCPUs,
		CreatedAt: now, ExpiresAt: now.Add(s.cfg.MaxTTL),
		Metadata:       map[string]string{"app": a.Name, "app_version": strconv.Itoa(a.Version)},
		IdempotencyKey: a.IdempotencyKey(),
	}
	placed, _, err := s.createIdempotent(ctx, sb, berth.CreateRequest{}, s.appActor())
	if err != nil {
		s.startRefused(ctx, a, err)
		return berth.Sandbox{}, false
	}
	if placed.State != berth.SandboxRunning {
		// The key's sandbox ended already (a start superseded and stopped earlier): the next
		// start needs a new key. (A failed start frees its key by itself.)
		incarnation := a.Incarnation
		s.noteApp(ctx, a.Name, "take a new incarnation", func(a *berth.App) error {
			if a.Incarnation != incarnation {
				return errSuperseded
			}
			a.Incarnation++
			return nil
		})
		return berth.Sandbox{}, false
	}
	return placed, true
}

// startRefused records why the scheduler did not place a's sandbox: a refusal that frees up
// (any retryable code, and tenant_over_quota) waits (waitCapacity); a request that can never
// be placed is the app's error; anything else is logged and retried next round.
func (s *Server) startRefused(ctx context.Context, a berth.App, err error) {
	code := berth.ErrorCode(err)
	var e *berth.Error
	switch {
	case errors.As(err, &e) && (e.Retryable() || code == berth.ETenantOverQuota):
		s.waitCapacity(ctx, a, e)
	case code == berth.EInvalidRequest || code == berth.ETemplateNotFound:
		s.failApp(ctx, a, "cannot be placed: "+berth.ErrorMessage(err))
	default:
		s.log.Warn("app start failed; will retry", "app", a.Name, "err", err)
	}
}

// switchApp makes sandbox placed (running version) serve app a, retiring what served before
// after a grace; if the app changed meanwhile, placed is stopped instead.
func (s *Server) switchApp(ctx context.Context, a berth.App, placed berth.Sandbox, version int) {
	var waited time.Time
	switched, err := s.commitApp(ctx, a.Name, "switch to its new sandbox", func(a *berth.App) error {
		if a.Desired != berth.DesireRunning || (a.Version != version && a.PausedSandbox != placed.ID) {
			return errSuperseded
		}
		if a.PausedSandbox == placed.ID {
			a.PausedSandbox, a.PausedVersion = "", 0
		}
		if a.SandboxID == placed.ID {
			return errSuperseded // another replica switched to it already
		}
		if a.SandboxID != "" {
			// Stopped after a grace: requests already routed to it finish there (no gap).
			a.Retire = append(a.Retire, a.SandboxID)
			a.RetireAt = s.cfg.Clock().Add(s.cfg.AppDrainGrace)
		}
		waited = a.WaitingSince
		a.SandboxID, a.AgentID, a.ServingVersion = placed.ID, placed.AgentID, version
		a.State = berth.AppRunning
		a.Reason = fmt.Sprintf("serving version %d from sandbox %s on agent/%s", version, placed.ID, placed.AgentID)
		resetStart(a)
		a.Incarnation++
		a.LastActive = s.cfg.Clock()
		return nil
	})
	switch {
	case err == nil:
		if !waited.IsZero() {
			// MET-4: from the first refusal to running.
			s.metrics.firstRefusal.WithLabelValues("app").Observe(s.cfg.Clock().Sub(waited).Seconds())
		}
		s.log.Info("app serving", "app", a.Name, "version", version, "sandbox", placed.ID, "agent", placed.AgentID,
			"retiring", switched.Retire, "retire_at", switched.RetireAt)
	case errors.Is(err, errSuperseded):
		cur, rerr := s.store.App(ctx, a.Name)
		if rerr == nil && cur.SandboxID == placed.ID {
			return
		}
		s.retireSandbox(ctx, placed.ID, "app "+a.Name+" changed while it started")
	default:
		s.retireSandbox(ctx, placed.ID, "app "+a.Name+" is gone or unreadable: "+err.Error())
	}
}

// setUpApp writes the spec's files into the sandbox's working directory, starts its
// command, and waits until something answers on its port (any HTTP answer), the command
// exits (service_exited, with its output) or AppStartTimeout passes.
//
// Every second of the wait it re-reads the app: a start whose app was deleted, redeployed or
// hibernated meanwhile gives up (errSuperseded) instead of holding its sandbox to the end.
func (s *Server) setUpApp(ctx context.Context, addr agentAt, id string, a berth.App) error {
	spec := a.Spec
	for _, p := range slices.Sorted(maps.Keys(spec.Files)) {
		if err := s.agents.writeFile(ctx, addr, id, "/tmp/"+p, strings.NewReader(spec.Files[p]), int64(len(spec.Files[p]))); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	err := s.agents.serve(ctx, addr, id, berth.ServiceRequest{Cmd: spec.Command, Env: spec.Env})
	if err != nil && berth.ErrorCode(err) != berth.EServiceRunning { // running: another replica started it
		return fmt.Errorf("start the command: %w", err)
	}
	return s.waitServing(ctx, addr, id, a)
}

// waitServing waits until something answers on a's port in sandbox id (any HTTP answer), its
// command exits (service_exited, with its output) or AppStartTimeout passes. Every second of
// the wait it re-reads the app: a start whose app was deleted, redeployed or hibernated
// meanwhile gives up (errSuperseded).
func (s *Server) waitServing(ctx context.Context, addr agentAt, id string, a berth.App) error {
	spec := a.Spec
	deadline := time.Now().Add(s.cfg.AppStartTimeout)
	for polls := 0; ; {
		err := s.agents.probe(ctx, addr, id, spec.Port)
		if err == nil || berth.ErrorCode(err) == berth.EServiceExited {
			return err
		}
		if polls++; polls%10 == 0 {
			cur, err := s.store.App(ctx, a.Name)
			if errors.Is(err, berth.ErrNotFound) || (err == nil && (cur.Version != a.Version || cur.Desired != berth.DesireRunning)) {
				return errSuperseded
			}
		}
		if time.Now().After(deadline) {
			st, _ := s.agents.serviceStatus(ctx, addr, id)
			return berth.Errorf(berth.EUpstream, "nothing answered on port %d within %s (%v); output: %s",
				spec.Port, s.cfg.AppStartTimeout, err, st.Output)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(20*time.Millisecond<<min(polls, 3), 100*time.Millisecond)): // 20, 40, 80, then every 100 ms
		}
	}
}

// appChanged wakes the requests of this replica waiting on app name (see appWatch).
func (s *Server) appChanged(name string) {
	s.appWatchMu.Lock()
	if ch, ok := s.appWatchers[name]; ok {
		close(ch)
		delete(s.appWatchers, name)
	}
	s.appWatchMu.Unlock()
}

// appWatch returns a channel closed at this replica's next write of app name, so a request
// held while the app wakes answers as soon as this replica switches it (other replicas'
// writes are seen by polling). Take it before reading the app, so no write slips between.
func (s *Server) appWatch(name string) <-chan struct{} {
	s.appWatchMu.Lock()
	defer s.appWatchMu.Unlock()
	ch, ok := s.appWatchers[name]
	if !ok {
		ch = make(chan struct{})
		s.appWatchers[name] = ch
	}
	return ch
}

// waitCapacity records a refusal: waiting_capacity (an event the first time), the first
// refusal's time, and the next try after Retry-After plus a full-jitter backoff (APP-2).
func (s *Server) waitCapacity(ctx context.Context, a berth.App, e *berth.Error) {
	version := a.Version
	s.noteApp(ctx, a.Name, "record a refusal", func(a *berth.App) error {
		if a.Version != version || a.Desired != berth.DesireRunning {
			return errSuperseded
		}
		now := s.cfg.Clock()
		if a.WaitingSince.IsZero() {
			a.WaitingSince = now
		}
		window := berth.Backoff(a.Attempts, s.cfg.AppBackoffBase, s.cfg.AppBackoffCap)
		a.Attempts++
		a.RetryCode = e.Code
		a.RetryAt = now.Add(e.RetryAfter + rand.N(window))
		a.State = berth.AppWaitingCapacity
		a.Reason = fmt.Sprintf("%s: %s (attempt %d; next try by %s, sooner if a host shows room)",
			e.Code, e.Message, a.Attempts, a.RetryAt.UTC().Format(time.RFC3339))
		return nil
	})
}

// startFailed counts a start whose command exited before serving (exited) or whose set-up
// failed otherwise; the app errors only after AppStartFailures exits in a row.
func (s *Server) startFailed(ctx context.Context, a berth.App, exited bool, cause error) {
	version := a.Version
	s.noteApp(ctx, a.Name, "record a failed start", func(a *berth.App) error {
		if a.Version != version || a.Desired != berth.DesireRunning {
			return errSuperseded
		}
		a.Incarnation++
		now := s.cfg.Clock()
		why := excerpt(oneLine(berth.ErrorMessage(cause)))
		if !exited {
			// Transient (agent unreachable, sandbox gone mid-setup): back off and retry.
			a.RetryAt = now.Add(rand.N(berth.Backoff(a.Attempts, s.cfg.AppBackoffBase, s.cfg.AppBackoffCap)))
			a.Attempts++
			a.Reason = fmt.Sprintf("start of version %d failed (%s); retrying", a.Version, why)
			return nil
		}
		a.StartFailures++
		if a.StartFailures >= s.cfg.AppStartFailures {
			a.State, a.RetryAt = berth.AppError, time.Time{}
			a.Reason = fmt.Sprintf("version %d never served, on %d starts in a row: %s", a.Version, a.StartFailures, why)
			if a.SandboxID != "" {
				a.Reason += fmt.Sprintf(" (version %d still serves)", a.ServingVersion)
			}
			return nil
		}
		a.RetryAt = now.Add(rand.N(berth.Backoff(a.StartFailures, s.cfg.AppBackoffBase, s.cfg.AppBackoffCap)))
		a.Reason = fmt.Sprintf("start %d of version %d never served (%s); retrying", a.StartFailures, a.Version, why)
		return nil
	})
}

// failApp moves a to error with reason: a fault no retry can fix.
func (s *Server) failApp(ctx context.Context, a berth.App, reason string) {
	version := a.Version
	s.noteApp(ctx, a.Name, "record the error", func(a *berth.App) error {
		if a.Version != version {
			return errSuperseded
		}
		a.State, a.Reason, a.RetryAt = berth.AppError, excerpt(oneLine(reason)), time.Time{}
		return nil
	})
}

// oneLine folds a multi-line message (a command's output tail) into one line for a reason,
// so tables of apps and events stay one row each.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(strings.TrimSpace(s), "\n", " ⏎ ")), " ")
}

// ReasonExcerptBytes bounds how much of a failure's text (which may carry a command's output,
// e.g. service_exited's output tail) an app's reason and its events keep: the first 512
// bytes, cut at a UTF-8 boundary and marked " …(cut)" (issue 15, point 6; docs/API.md). It
// is the bound an operator's drain reason is refused past (berth.MaxReasonBytes).
const ReasonExcerptBytes = berth.MaxReasonBytes

// excerpt returns s cut to ReasonExcerptBytes.
func excerpt(s string) string {
	if len(s) <= ReasonExcerptBytes {
		return s
	}
	cut := ReasonExcerptBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + " …(cut)"
}

// settle applies fn and stops the sandboxes it retired.
func (s *Server) settle(ctx context.Context, name string, fn func(a *berth.App) error) {
	a, err := s.commitApp(ctx, name, "settle", fn)
	if err != nil {
		return // superseded, deleted, or the store failed (logged): the next round decides
	}
	for _, id := range a.Retire {
		s.retireSandbox(ctx, id, "app "+name+" "+string(a.State))
	}
	s.kickApps()
}

// unserve moves a's serving sandbox to its retire list, to be stopped at once.
func unserve(a *berth.App) {
	if a.SandboxID != "" {
		a.Retire = append(a.Retire, a.SandboxID)
	}
	a.RetireAt = time.Time{}
	a.SandboxID, a.AgentID, a.ServingVersion = "", "", 0
}

// mutateApp reads the app, applies fn and writes it over the revision read, re-reading on a
// concurrent write (a few times). fn's errors (errSuperseded) stop it; the event's reason is
// the app's Reason after fn.
func (s *Server) mutateApp(ctx context.Context, name, actor string, fn func(a *berth.App) error) (berth.App, error) {
	for range 10 {
		a, err := s.store.App(ctx, name)
		if err != nil {
			return a, err
		}
		if err := fn(&a); err != nil {
			return a, err
		}
		updated, err := s.store.UpdateApp(ctx, a, a.Reason, actor, s.cfg.Clock())
		if errors.Is(err, berth.ErrStaleRevision) {
			continue
		}
		if err == nil {
			s.wroteApp(name, updated.Revision)
			s.appChanged(name)
		}
		return updated, err
	}
	return berth.App{}, berth.ErrStaleRevision
}

// wroteApp notes that this replica wrote revision rev of app name, keeping the newest.
func (s *Server) wroteApp(name string, rev int64) {
	for {
		old, loaded := s.appWritten.LoadOrStore(name, rev)
		if !loaded || old.(int64) >= rev || s.appWritten.CompareAndSwap(name, old, rev) {
			return
		}
	}
}

// appAsOfNow returns a, or the app as the store has it now when this replica has written a
// newer revision than a. A round works from the list it read when it began, and this
// replica may have written the app since, e.g. the round before it recording a refusal and
// the next try after Retry-After; acting on the older copy would undo or repeat what that
// write settled, such as a second try before Retry-After (APP-2). ok is false when the app
// cannot be read now (deleted, or the store is down): the next round sees.
func (s *Server) appAsOfNow(ctx context.Context, a berth.App) (_ berth.App, ok bool) {
	v, wrote := s.appWritten.Load(a.Name)
	if !wrote || v.(int64) <= a.Revision {
		return a, true // no read: the list holds this replica's last write, or a later one
	}
	cur, err := s.store.App(ctx, a.Name)
	if errors.Is(err, berth.ErrNotFound) {
		s.appWritten.CompareAndDelete(a.Name, v)
	}
	if err != nil {
		return a, false
	}
	if cur.Revision < v.(int64) { // deleted and created again since: its count starts over
		s.appWritten.CompareAndSwap(a.Name, v, cur.Revision)
	}
	return cur, true
}

// retireSandbox stops a sandbox an app no longer uses (if it still runs) and records it. It
// reports false only when the store could not say what became of the sandbox (logged): the
// caller keeps it on the retire list for the next round, rather than leave it running.
func (s *Server) retireSandbox(ctx context.Context, id, reason string) bool {
	sb, err := s.store.Sandbox(ctx, id)
	if errors.Is(err, berth.ErrNotFound) {
		return true
	}
	if err != nil {
		s.log.Warn("app reconciler: reading a sandbox to retire failed; it stays on the retire list", "sandbox", id, "err", err)
		return false
	}
	if !sb.State.Terminal() {
		s.discard(ctx, sb, reason)
	}
	return true
}

func (s *Server) appActor() string { return "reconciler/" + s.cfg.ReplicaID }
