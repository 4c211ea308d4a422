package server

import (
	"cmp"
	"fmt"
	"time"

	"github.com/berth-dev/berth"
)

// The app reconciler decides, then does: observeApp reads what one step
// needs (the sandboxes the record names, this replica's activity, room on a host), decide
// turns the record and those facts into one appAction without any I/O, and applyApp carries
// the action out. decide is a pure function of (app, facts, now); appdecide_test.go covers
// every app state × desired state × situation.

// appActionKind is what one reconciler step does for an app.
type appActionKind int

const (
	// actNone: nothing to do this round (at rest, or a sandbox the store could not read, or
	// one pausing or resuming: the next round sees its outcome).
	actNone appActionKind = iota
	// actWait: a retry is pending until Until (APP-2's Retry-After plus jitter, or a failed
	// start's backoff) and no host shows room that would cut it short.
	actWait
	// actRetire: the retire list's grace has passed: stop those sandboxes, drop them from
	// the list, and decide again.
	actRetire
	// actPause: hibernate by pausing the serving sandbox (PAUSE-2); Reason is the why.
	actPause
	// actSettle: go to Target (hibernated or stopped) without a sandbox, stopping the
	// serving one; a stopped app also drops its paused sandbox.
	actSettle
	// actLost: the serving sandbox ended or is unknown to the store: record it (waking, a
	// new incarnation) and decide again.
	actLost
	// actIdle: no request for idle_seconds (C25): desired becomes hibernated.
	actIdle
	// actMarkRunning: the serving sandbox already runs the current version (a deploy of the
	// version already serving): record running.
	actMarkRunning
	// actForget: the paused sandbox cannot be resumed (gone, or an older version): retire
	// it and decide again (a fresh start).
	actForget
	// actResume: resume the paused sandbox, wait until it answers, switch to it.
	actResume
	// actServePaused: the paused sandbox is running (its pause failed): wait until it
	// answers, switch to it.
	actServePaused
	// actStart: place a new sandbox for the current version (startApp).
	actStart
	numAppActionKinds
)

var appActionNames = [...]string{"none", "wait", "retire", "pause", "settle", "lost", "idle",
	"mark_running", "forget", "resume", "serve_paused", "start"}

func (k appActionKind) String() string {
	if k < 0 || k >= numAppActionKinds {
		return fmt.Sprintf("action(%d)", int(k))
	}
	return appActionNames[k]
}

// appAction is decide's answer: one step for one app.
type appAction struct {
	Kind   appActionKind
	Target berth.AppState // actSettle: hibernated or stopped
	// Reason is the reason the step writes (actPause, actSettle, actForget), or what
	// became of the serving sandbox (actLost).
	Reason string
	// Until is when a pending retry is due (actWait).
	Until time.Time
	// Idle is how long the app has had no request, LastActive the record's activity the
	// decision saw (actIdle: a later one on the record supersedes it, C25).
	Idle       time.Duration
	LastActive time.Time
	// Gone is the serving sandbox that ended (actLost); Sandbox the paused one (actResume,
	// actServePaused).
	Gone    string
	Sandbox berth.Sandbox
}

// sbSeen is what the store said of a sandbox the app names.
type sbSeen int

const (
	sbNotRead    sbSeen = iota // not needed this step
	sbUnreadable               // the store failed (logged); the next round reads again
	sbMissing                  // the store does not know it
	sbFound                    // Sandbox holds it
)

// sbView is one sandbox as observed for a step.
type sbView struct {
	Seen    sbSeen
	Sandbox berth.Sandbox
}

// appFacts is what decide needs beyond the app's record.
type appFacts struct {
	Serving       sbView    // a.SandboxID, read when desired running
	Paused        sbView    // a.PausedSandbox, read when waking it
	CanCheckpoint bool      // a.AgentID's runtime can checkpoint (PAUSE-2)
	OpenHere      bool      // a request or connection is open on this replica (C25)
	SeenHere      time.Time // this replica's last activity of the app (C25)
	Room          bool      // a host would take the app's sandbox now (asked when needsRoom)
}

// decide is the app reconciler's one step for app a at now (APP-1, APP-2, C25, PAUSE-2).
// It does no I/O: everything it looks at is in a and f.
func decide(a berth.App, f appFacts, now time.Time) appAction {
	if len(a.Retire) > 0 && !now.Before(a.RetireAt) {
		return appAction{Kind: actRetire}
	}
	if a.Desired != berth.DesireRunning {
		return decideAtRest(a, f)
	}
	if a.SandboxID != "" {
		sb := f.Serving
		switch {
		case sb.Seen == sbNotRead || sb.Seen == sbUnreadable:
			return appAction{Kind: actNone}
		case sb.Seen == sbMissing:
			return appAction{Kind: actLost, Gone: a.SandboxID,
				Reason: fmt.Sprintf("sandbox %s gone (the store does not know it)", a.SandboxID)}
		case sb.Sandbox.State.Terminal():
			return appAction{Kind: actLost, Gone: a.SandboxID,
				Reason: fmt.Sprintf("sandbox %s %s (%s)", a.SandboxID, sb.Sandbox.State, sb.Sandbox.Reason)}
		}
		if a.ServingVersion == a.Version {
			return decideServing(a, f, now)
		}
	}
	if a.State == berth.AppError {
		return appAction{Kind: actNone} // what a retry cannot fix waits for a deploy or a wake
	}
	if a.SandboxID == "" && a.PausedSandbox != "" {
		return decideWake(a, f, now)
	}
	// Room on a host is no news to an app its tenant's quota holds back: that one keeps its
	// backoff.
	early := a.State == berth.AppWaitingCapacity && a.RetryCode != berth.ETenantOverQuota && f.Room
	if now.Before(a.RetryAt) && !early {
		return appAction{Kind: actWait, Until: a.RetryAt}
	}
	return appAction{Kind: actStart}
}

// decideAtRest is decide for desired hibernated or stopped.
func decideAtRest(a berth.App, f appFacts) appAction {
	target := berth.AppHibernated
	if a.Desired == berth.DesireStopped {
		target = berth.AppStopped
	}
	if a.SandboxID == "" && a.State == target && (target == berth.AppHibernated || a.PausedSandbox == "") {
		return appAction{Kind: actNone}
	}
	why := cmp.Or(a.Reason, string(a.Desired))
	if target == berth.AppHibernated && a.SandboxID != "" && f.CanCheckpoint {
		return appAction{Kind: actPause, Reason: why}
	}
	return appAction{Kind: actSettle, Target: target, Reason: why}
}

// decideServing is decide for a running app served by a live sandbox of its current
// version: idle hibernation (C25), or recording running after a deploy of that version.
func decideServing(a berth.App, f appFacts, now time.Time) appAction {
	if a.State == berth.AppRunning && a.IdleSeconds > 0 && !f.OpenHere {
		// C25: idle counts from the end of the last request or connection, on any replica.
		// Another replica's activity reaches the record at most a flush period late (while a
		// request is open there, it is rewritten every period), so the record's time counts
		// as that much later: an app is never hibernated early.
		last := a.LastActive
		if !last.IsZero() {
			last = last.Add(appFlushEvery(a.IdleSeconds))
		}
		if f.SeenHere.After(last) {
			last = f.SeenHere
		}
		if idle := now.Sub(last); idle >= time.Duration(a.IdleSeconds)*time.Second {
			return appAction{Kind: actIdle, Idle: idle, LastActive: a.LastActive}
		}
		return appAction{Kind: actNone}
	}
	if a.State != berth.AppRunning {
		return appAction{Kind: actMarkRunning}
	}
	return appAction{Kind: actNone}
}

// decideWake is decide for an app to wake from its paused sandbox (PAUSE-2). A fresh start
// instead comes after actForget, whose step decides again.
func decideWake(a berth.App, f appFacts, now time.Time) appAction {
	if a.PausedVersion != a.Version {
		return appAction{Kind: actForget, Reason: fmt.Sprintf(
			"version %d was deployed while it slept: starting it instead of resuming version %d", a.Version, a.PausedVersion)}
	}
	if f.Paused.Seen != sbFound {
		return appAction{Kind: actNone} // the store is down; the next round tries again
	}
	sb := f.Paused.Sandbox
	switch {
	case sb.State == berth.SandboxPaused:
		if now.Before(a.RetryAt) && !f.Room {
			return appAction{Kind: actWait, Until: a.RetryAt}
		}
		return appAction{Kind: actResume, Sandbox: sb}
	case sb.State == berth.SandboxRunning:
		return appAction{Kind: actServePaused, Sandbox: sb} // its pause failed: serve from it
	case sb.State.Terminal():
		return appAction{Kind: actForget, Reason: fmt.Sprintf("its paused sandbox %s (%s): starting a new one", sb.State, sb.Reason)}
	}
	return appAction{Kind: actNone} // pausing, resuming: the next round sees the outcome
}

// needsRoom reports whether decide will look at f.Room for a at now, so observeApp asks the
// scheduler's snapshot only then.
func needsRoom(a berth.App, now time.Time) bool {
	if a.Desired != berth.DesireRunning || a.State == berth.AppError || !now.Before(a.RetryAt) {
		return false
	}
	if a.SandboxID == "" && a.PausedSandbox != "" {
		return true
	}
	if a.SandboxID != "" && a.ServingVersion == a.Version {
		return false // serving its version; once the sandbox is lost, the next step asks again
	}
	return a.State == berth.AppWaitingCapacity && a.RetryCode != berth.ETenantOverQuota
}
