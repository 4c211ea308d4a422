package server

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// The app reconciler's decision table (APP-1, APP-2, C25, PAUSE-2): every app state ×
// desired state × situation, decided by the pure decide. docs/DECISIONS.md describes its
// shape.

// appStates (metrics.go's list, which the berth_apps gauge reports) and appDesires are
// every AppState and AppDesired app.go declares (TestDecide_TableIsComplete checks against
// the source).
var appDesires = []berth.AppDesired{berth.DesireRunning, berth.DesireHibernated, berth.DesireStopped}

// situation is what the reconciler finds besides the app's state and desired state: its
// sandboxes as the store has them, activity, a pending retry, room on a host.
type situation int

const (
	sitNothing           situation = iota // no sandbox, nothing pending
	sitServing                            // serving its version, busy
	sitServingCheckpoint                  // as sitServing, on a host that can checkpoint
	sitServingEnded                       // the serving sandbox is lost (lease expired)
	sitServingMissing                     // the store does not know the serving sandbox
	sitServingUnreadable                  // the store failed reading it
	sitIdle                               // serving, no request for idle_seconds (C25)
	sitIdleOpenHere                       // idle by the record, a request open on this replica
	sitIdleSeenHere                       // idle by the record, a request ended here lately
	sitIdleFlushLag                       // idle only if another replica's flush lag is ignored
	sitDeployed                           // serving an older version: a deploy
	sitDeployedBackoff                    // a deploy whose start is backing off
	sitBackoffPending                     // no sandbox, a refusal's retry not due, no room
	sitRoomShown                          // as sitBackoffPending, but a host shows room
	sitQuotaRoom                          // as sitRoomShown, refused for the tenant's quota
	sitBackoffDue                         // the retry is due
	sitPaused                             // hibernated by pause; the paused sandbox is paused
	sitPausedBackoff                      // its resume was refused, retry not due, no room
	sitPausedRoom                         // as sitPausedBackoff, but a host shows room
	sitPausedRunning                      // its pause failed: the sandbox runs
	sitPausedInFlux                       // still pausing (or resuming)
	sitPausedEnded                        // the paused sandbox ended
	sitPausedUnreadable                   // the store failed reading it
	sitPausedOldVersion                   // a deploy while it slept
	sitRetireDue                          // sandboxes to retire, grace over
	sitRetireNotDue                       // sandboxes to retire, grace running
	numSituations
)

var situationNames = [...]string{"nothing", "serving", "serving_checkpointable", "serving_ended",
	"serving_missing", "serving_unreadable", "idle", "idle_open_here", "idle_seen_here", "idle_flush_lag",
	"deployed", "deployed_backoff", "backoff_pending", "room_shown", "quota_room", "backoff_due",
	"paused", "paused_backoff", "paused_room", "paused_running", "paused_in_flux", "paused_ended",
	"paused_unreadable", "paused_old_version", "retire_due", "retire_not_due"}

func (s situation) String() string {
	if s < 0 || int(s) >= len(situationNames) {
		return "situation(" + strconv.Itoa(int(s)) + ")"
	}
	return situationNames[s]
}

var decideNow = time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)

// situationOf sets up a (version 2, idle_seconds 60, active 10 s ago) and its facts for sit.
func situationOf(sit situation, a *berth.App, f *appFacts) {
	now := decideNow
	serve := func(version int, st berth.SandboxState) {
		a.SandboxID, a.AgentID, a.ServingVersion = "sb-serve", "a1", version
		f.Serving = sbView{Seen: sbFound, Sandbox: berth.Sandbox{ID: "sb-serve", AgentID: "a1", State: st}}
	}
	paused := func(st berth.SandboxState) {
		a.PausedSandbox, a.PausedVersion = "sb-paused", a.Version
		f.Paused = sbView{Seen: sbFound, Sandbox: berth.Sandbox{ID: "sb-paused", State: st, Reason: "why"}}
	}
	backoff := func(code string, room bool) {
		a.RetryAt, a.RetryCode, f.Room = now.Add(10*time.Second), code, room
	}
	switch sit {
	case sitNothing:
	case sitServing:
		serve(2, berth.SandboxRunning)
	case sitServingCheckpoint:
		serve(2, berth.SandboxRunning)
		f.CanCheckpoint = true
	case sitServingEnded:
		serve(2, berth.SandboxLost)
	case sitServingMissing:
		serve(2, berth.SandboxRunning)
		f.Serving = sbView{Seen: sbMissing}
	case sitServingUnreadable:
		serve(2, berth.SandboxRunning)
		f.Serving = sbView{Seen: sbUnreadable}
	case sitIdle, sitIdleOpenHere, sitIdleSeenHere:
		serve(2, berth.SandboxRunning)
		a.LastActive = now.Add(-2 * time.Minute)
		f.OpenHere = sit == sitIdleOpenHere
		if sit == sitIdleSeenHere {
			f.SeenHere = now.Add(-10 * time.Second)
		}
	case sitIdleFlushLag: // 70 s since the record's activity, but it may be 15 s late
		serve(2, berth.SandboxRunning)
		a.LastActive = now.Add(-70 * time.Second)
	case sitDeployed, sitDeployedBackoff:
		serve(1, berth.SandboxRunning)
		if sit == sitDeployedBackoff {
			backoff(berth.ENoCapacity, false)
		}
	case sitBackoffPending:
		backoff(berth.ENoCapacity, false)
	case sitRoomShown:
		backoff(berth.ENoCapacity, true)
	case sitQuotaRoom:
		backoff(berth.ETenantOverQuota, true)
	case sitBackoffDue:
		a.RetryAt, a.RetryCode = now.Add(-time.Second), berth.ENoCapacity
	case sitPaused:
		paused(berth.SandboxPaused)
	case sitPausedBackoff, sitPausedRoom:
		paused(berth.SandboxPaused)
		backoff(berth.ENoCapacity, sit == sitPausedRoom)
	case sitPausedRunning:
		paused(berth.SandboxRunning)
	case sitPausedInFlux:
		paused(berth.SandboxPausing)
	case sitPausedEnded:
		paused(berth.SandboxStopped)
	case sitPausedUnreadable:
		paused(berth.SandboxPaused)
		f.Paused = sbView{Seen: sbUnreadable}
	case sitPausedOldVersion:
		paused(berth.SandboxPaused)
		a.PausedVersion = 1
		f.Paused = sbView{} // not read: the version alone decides
	case sitRetireDue, sitRetireNotDue:
		a.Retire, a.RetireAt = []string{"sb-old"}, now.Add(-time.Second)
		if sit == sitRetireNotDue {
			a.RetireAt = now.Add(5 * time.Second)
		}
	}
}

// decideRow: for sit and desired, every state decides want, except the states listed.
type decideRow struct {
	sit     situation
	desired berth.AppDesired
	want    appActionKind
	except  map[berth.AppState]appActionKind
}

var (
	errNone     = map[berth.AppState]appActionKind{berth.AppError: actNone}
	restingHib  = map[berth.AppState]appActionKind{berth.AppHibernated: actNone}
	restingStop = map[berth.AppState]appActionKind{berth.AppStopped: actNone}
	// A sandbox serving the current version is recorded running whatever the state says.
	servingIdle = map[berth.AppState]appActionKind{berth.AppHibernated: actMarkRunning, berth.AppWaking: actMarkRunning,
		berth.AppDeploying: actMarkRunning, berth.AppWaitingCapacity: actMarkRunning, berth.AppStopped: actMarkRunning,
		berth.AppError: actMarkRunning}
	servingBusy = map[berth.AppState]appActionKind{berth.AppRunning: actNone}
)

// running, hibernated and stopped are the desired states' rows of one situation.
func rows(sit situation, running decideRow, hibernated decideRow, stopped decideRow) []decideRow {
	running.sit, running.desired = sit, berth.DesireRunning
	hibernated.sit, hibernated.desired = sit, berth.DesireHibernated
	stopped.sit, stopped.desired = sit, berth.DesireStopped
	return []decideRow{running, hibernated, stopped}
}

func decideTable() []decideRow {
	settle := decideRow{want: actSettle}
	hibRest := decideRow{want: actSettle, except: restingHib}
	stopRest := decideRow{want: actSettle, except: restingStop}
	return slices.Concat(
		rows(sitNothing, decideRow{want: actStart, except: errNone}, hibRest, stopRest),
		rows(sitServing, decideRow{want: actMarkRunning, except: servingBusy}, settle, settle),
		rows(sitServingCheckpoint, decideRow{want: actMarkRunning, except: servingBusy}, decideRow{want: actPause}, settle),
		rows(sitServingEnded, decideRow{want: actLost}, settle, settle),
		rows(sitServingMissing, decideRow{want: actLost}, settle, settle),
		rows(sitServingUnreadable, decideRow{want: actNone}, settle, settle),
		rows(sitIdle, decideRow{want: actIdle, except: servingIdle}, settle, settle),
		rows(sitIdleOpenHere, decideRow{want: actMarkRunning, except: servingBusy}, settle, settle),
		rows(sitIdleSeenHere, decideRow{want: actMarkRunning, except: servingBusy}, settle, settle),
		rows(sitIdleFlushLag, decideRow{want: actMarkRunning, except: servingBusy}, settle, settle),
		rows(sitDeployed, decideRow{want: actStart, except: errNone}, settle, settle),
		rows(sitDeployedBackoff, decideRow{want: actWait, except: errNone}, settle, settle),
		rows(sitBackoffPending, decideRow{want: actWait, except: errNone}, hibRest, stopRest),
		rows(sitRoomShown, decideRow{want: actWait, except: map[berth.AppState]appActionKind{
			berth.AppWaitingCapacity: actStart, berth.AppError: actNone}}, hibRest, stopRest),
		rows(sitQuotaRoom, decideRow{want: actWait, except: errNone}, hibRest, stopRest),
		rows(sitBackoffDue, decideRow{want: actStart, except: errNone}, hibRest, stopRest),
		rows(sitPaused, decideRow{want: actResume, except: errNone}, hibRest, settle),
		rows(sitPausedBackoff, decideRow{want: actWait, except: errNone}, hibRest, settle),
		rows(sitPausedRoom, decideRow{want: actResume, except: errNone}, hibRest, settle),
		rows(sitPausedRunning, decideRow{want: actServePaused, except: errNone}, hibRest, settle),
		rows(sitPausedInFlux, decideRow{want: actNone}, hibRest, settle),
		rows(sitPausedEnded, decideRow{want: actForget, except: errNone}, hibRest, settle),
		rows(sitPausedUnreadable, decideRow{want: actNone}, hibRest, settle),
		rows(sitPausedOldVersion, decideRow{want: actForget, except: errNone}, hibRest, settle),
		rows(sitRetireDue, decideRow{want: actRetire}, decideRow{want: actRetire}, decideRow{want: actRetire}),
		rows(sitRetireNotDue, decideRow{want: actStart, except: errNone}, hibRest, stopRest),
	)
}

// TestDecide_Table: decide's action for every state × desired state × situation.
func TestDecide_Table(t *testing.T) {
	for _, r := range decideTable() {
		for _, st := range appStates {
			want := r.want
			if w, ok := r.except[st]; ok {
				want = w
			}
			a := berth.App{Name: "web", Version: 2, Desired: r.desired, State: st, Reason: "owner's word",
				IdleSeconds: 60, LastActive: decideNow.Add(-10 * time.Second)}
			var f appFacts
			situationOf(r.sit, &a, &f)
			if got := decide(a, f, decideNow); got.Kind != want {
				t.Errorf("situation %s, desired %s, state %s: %s; want %s", r.sit, r.desired, st, got.Kind, want)
			}
		}
	}
}

// TestDecide_TableIsComplete fails when a state, a desired state or a situation is added
// without rows, or an action is never decided by any row.
func TestDecide_TableIsComplete(t *testing.T) {
	states, desires := declaredConsts(t, "AppState"), declaredConsts(t, "AppDesired")
	if got := stringsOf(appStates); !slices.Equal(got, states) {
		t.Errorf("app.go declares states %v; the table has %v", states, got)
	}
	if got := stringsOf(appDesires); !slices.Equal(got, desires) {
		t.Errorf("app.go declares desired states %v; the table has %v", desires, got)
	}
	if len(situationNames) != int(numSituations) {
		t.Errorf("%d situation names for %d situations", len(situationNames), numSituations)
	}
	seen := map[situation]map[berth.AppDesired]int{}
	kinds := map[appActionKind]bool{}
	for _, r := range decideTable() {
		if seen[r.sit] == nil {
			seen[r.sit] = map[berth.AppDesired]int{}
		}
		seen[r.sit][r.desired]++
		kinds[r.want] = true
		for st, k := range r.except {
			if !slices.Contains(appStates, st) {
				t.Errorf("situation %s: exception for unknown state %q", r.sit, st)
			}
			kinds[k] = true
		}
	}
	for sit := range numSituations {
		for _, d := range appDesires {
			if n := seen[sit][d]; n != 1 {
				t.Errorf("situation %s, desired %s: %d rows; want 1", sit, d, n)
			}
		}
	}
	for k := range numAppActionKinds {
		if !kinds[k] {
			t.Errorf("no row decides %s", k)
		}
	}
}

// declaredConsts returns the values of app.go's constants of type typ, in order.
func declaredConsts(t *testing.T, typ string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../app.go", nil, 0)
	must(t, err)
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || vs.Type == nil || len(vs.Values) != len(vs.Names) {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); ok && id.Name == typ {
			for _, v := range vs.Values {
				if lit, ok := v.(*ast.BasicLit); ok {
					s, err := strconv.Unquote(lit.Value)
					must(t, err)
					out = append(out, s)
				}
			}
		}
		return true
	})
	if len(out) == 0 {
		t.Fatalf("no %s constants in app.go", typ)
	}
	return out
}

func stringsOf[S ~string](xs []S) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = string(x)
	}
	return out
}

// TestDecide_WhatItCarries: the actions carry what their steps write: the lost sandbox and
// its end, the idle time and the activity it was measured from (C25), the owner's reason
// for a settle, the paused sandbox to resume, a retry's time.
func TestDecide_WhatItCarries(t *testing.T) {
	base := func(sit situation, d berth.AppDesired, st berth.AppState) (berth.App, appFacts) {
		a := berth.App{Name: "web", Version: 2, Desired: d, State: st, IdleSeconds: 60, LastActive: decideNow.Add(-10 * time.Second)}
		var f appFacts
		situationOf(sit, &a, &f)
		return a, f
	}
	a, f := base(sitServingEnded, berth.DesireRunning, berth.AppRunning)
	if got := decide(a, f, decideNow); got.Gone != "sb-serve" || got.Reason != "sandbox sb-serve lost ()" {
		t.Errorf("lost: %+v", got)
	}
	a, f = base(sitServingMissing, berth.DesireRunning, berth.AppRunning)
	if got := decide(a, f, decideNow); got.Reason != "sandbox sb-serve gone (the store does not know it)" {
		t.Errorf("missing: %+v", got)
	}
	a, f = base(sitIdle, berth.DesireRunning, berth.AppRunning)
	// The record's activity 2 min ago counts as 15 s later (a quarter of idle_seconds).
	if got := decide(a, f, decideNow); got.Idle != 105*time.Second || !got.LastActive.Equal(a.LastActive) {
		t.Errorf("idle: %+v", got)
	}
	a, f = base(sitNothing, berth.DesireStopped, berth.AppRunning)
	if got := decide(a, f, decideNow); got.Target != berth.AppStopped || got.Reason != "stopped" {
		t.Errorf("stop without a reason: %+v; want target stopped, reason the desired state", got)
	}
	a, f = base(sitPaused, berth.DesireRunning, berth.AppHibernated)
	if got := decide(a, f, decideNow); got.Sandbox.ID != "sb-paused" {
		t.Errorf("resume: %+v", got)
	}
	a, f = base(sitBackoffPending, berth.DesireRunning, berth.AppWaitingCapacity)
	if got := decide(a, f, decideNow); !got.Until.Equal(a.RetryAt) {
		t.Errorf("wait: %+v; want until %s", got, a.RetryAt)
	}
	a, f = base(sitPausedOldVersion, berth.DesireRunning, berth.AppHibernated)
	if got := decide(a, f, decideNow); !strings.Contains(got.Reason, "version 2 was deployed while it slept") {
		t.Errorf("forget: %+v", got)
	}
}
