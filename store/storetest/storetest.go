// Package storetest is the conformance suite every berth.Store passes (store/sqlite and
// store/postgres): one behaviour, pinned once, for every backend. It is imported by the
// backends' tests only.
//
// Time is an input: every call takes a fixed time derived from T0, never the wall clock.
package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berth-dev/berth"
)

// T0 is the "now" of the suite; it has millisecond precision so it survives every backend.
var T0 = time.Date(2031, time.March, 14, 15, 9, 26, 535_000_000, time.UTC)

// Run runs the conformance suite. open must return a new, empty, migrated store for each call
// and close it when t ends (t.Cleanup).
func Run(t *testing.T, open func(t *testing.T) berth.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, open func(t *testing.T) berth.Store)
	}{
		{"Ping", one(testPing)},
		{"Templates", one(testTemplates)},
		{"Tenants", one(testTenants)},
		{"TenantCreatedOnce", one(testTenantCreatedOnce)},
		{"APIKeys", one(testAPIKeys)},
		{"AgentCredentials", one(testAgentCredentials)},
		{"AgentJoinsRace", one(testAgentJoinsRace)},
		{"HeartbeatAfterRevoke", one(testHeartbeatAfterRevoke)},
		{"HeartbeatCredentialLive", one(testHeartbeatCredentialLive)},
		{"CreateSandboxRoundTrip", one(testCreateSandboxRoundTrip)},
		{"TimesAreUTCMilliseconds", one(testTimesAreUTCMilliseconds)},
		{"SandboxNotFound", one(testSandboxNotFound)},
		{"IdempotencyConflict", one(testIdempotencyConflict)},
		{"FailedFreesIdempotencyKey", one(testFailedFreesIdempotencyKey)},
		{"RanThenFailedKeepsIdempotencyKey", one(testRanThenFailedKeepsIdempotencyKey)},
		{"IdempotentCalls", one(testIdempotentCalls)},
		{"IdempotentCallConcurrentClaims", one(testIdempotentCallConcurrentClaims)},
		{"TransitionSandbox", one(testTransitionSandbox)},
		{"TerminalTransitionReleasesReservations", one(testTerminalReleases)},
		{"SandboxesFilter", one(testSandboxesFilter)},
		{"HeartbeatRoundTrip", one(testHeartbeatRoundTrip)},
		{"HeartbeatEvents", one(testHeartbeatEvents)},
		{"OperatorDrain", one(testOperatorDrain)},
		{"OperatorDrainOfSelfDrainingAgent", one(testDrainOfSelfDraining)},
		{"HeartbeatNetting", one(testHeartbeatNetting)},
		{"HeartbeatEnded", one(testHeartbeatEnded)},
		{"RestartLosesUnheldSandboxes", one(testRestartLosesUnheld)},
		{"UnheldRunning", one(testUnheldRunning)},
		{"ClaimSweep", one(testClaimSweep)},
		{"HeartbeatPromotesStarting", one(testHeartbeatPromotesStarting)},
		{"PauseStatesAreLive", one(testPauseStatesAreLive)},
		{"MoveSandbox", one(testMoveSandbox)},
		{"MoveSandboxTerminalReleasesReservations", one(testMoveSandboxReleases)},
		{"PausedUntouchedByHeartbeats", one(testPausedUntouchedByHeartbeats)},
		{"HeartbeatPromotesResuming", one(testHeartbeatPromotesResuming)},
		{"AgentRuntime", one(testAgentRuntime)},
		{"OvertakenHeartbeat", one(testOvertakenHeartbeat)},
		{"CreateOutcomeQuarantine", one(testCreateOutcome)},
		{"RestartClearsQuarantine", one(testRestartClearsQuarantine)},
		{"PurgeEnded", one(testPurgeEnded)},
		{"EndedSandboxes", one(testEndedSandboxes)},
		{"HeldEnded", one(testHeldEnded)},
		{"EndedSandboxesLongList", one(testEndedSandboxesLongList)},
		{"SandboxReads", one(testSandboxReads)},
		{"EventsUntilAndTo", one(testEventsUntilAndTo)},
		{"LogEvents", one(testLogEvents)},
		{"PinVolume", one(testPinVolume)},
		{"Apps", one(testApps)},
		{"Quota", one(testQuota)},
		{"OOMEvents", one(testOOMEvents)},
		{"HeldDelta", one(testHeldDelta)},
		{"UnmeasuredHeld", one(testUnmeasuredHeld)},
		{"AgentsChangedSince", one(testAgentsChangedSince)},
		{"HeldDeltaNetsAndPromotes", one(testHeldDeltaNetsAndPromotes)},
		{"UsualDeltaKeepsOrder", one(testUsualDeltaKeepsOrder)},
		{"Reserve", testReserve},
		{"ReserveEvent", one(testReserveEvent)},
		{"ReserveConcurrentNeverOverAdmits", one(testReserveConcurrent)},
		{"ReserveAndCreate", one(testReserveAndCreate)},
		{"ReserveAndCreateConcurrentNeverOverAdmits", one(testReserveAndCreateConcurrent)},
		{"ConcurrentWritersQueue", one(testConcurrentWriters)},
		{"Release", one(testRelease)},
		{"PendingAndReservations", one(testPendingAndReservations)},
		{"SweepReservations", one(testSweepReservations)},
		{"RenewReservation", one(testRenew)},
		{"EventsFilter", one(testEventsFilter)},
		{"OrderingIsBytewise", one(testOrderingIsBytewise)},
		{"WatchAgents", one(testWatchAgents)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, open)
		})
	}
}

// one adapts a test of one fresh store to the suite's table.
func one(f func(t *testing.T, s berth.Store)) func(t *testing.T, open func(t *testing.T) berth.Store) {
	return func(t *testing.T, open func(t *testing.T) berth.Store) { f(t, open(t)) }
}

// eventOpts compares events without their store-assigned ids.
var eventOpts = cmp.Options{cmpopts.IgnoreFields(berth.Event{}, "ID"), cmpopts.EquateEmpty()}

// at returns T0 plus d.
func at(d time.Duration) time.Time { return T0.Add(d) }

func testPing(t *testing.T, s berth.Store) {
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

// heartbeat returns a minimal active heartbeat of agent id admitting admittable MiB.
func heartbeat(id string, admittable int64) berth.Heartbeat {
	return berth.Heartbeat{
		AgentID: id, Address: "http://127.0.0.1:1", Status: berth.AgentActive, BootID: "boot-" + id,
		MemoryMiBTotal: 8192, MemoryMiBAdmittable: admittable, IntakeOpen: true, HeartbeatAt: T0,
	}
}

// mustHeartbeat applies hb at now and returns the netted count.
func mustHeartbeat(t *testing.T, s berth.Store, hb berth.Heartbeat, now time.Time) int {
	t.Helper()
	n, err := s.ApplyHeartbeat(t.Context(), hb, now)
	if err != nil {
		t.Fatalf("ApplyHeartbeat(%s): %v", hb.AgentID, err)
	}
	return n
}

// sandbox returns a sandbox fixture placed on agent in state.
func sandbox(id, tenant, agent string, state berth.SandboxState) berth.Sandbox {
	return berth.Sandbox{
		ID: id, Template: "python", Tenant: tenant, AgentID: agent, State: state,
		MemoryMiB: 512, VCPUs: 1, CreatedAt: T0, ExpiresAt: at(time.Hour),
	}
}

// mustCreate creates sb at now, actor "test".
func mustCreate(t *testing.T, s berth.Store, sb berth.Sandbox, now time.Time) {
	t.Helper()
	if err := s.CreateSandbox(t.Context(), sb, "test", now); err != nil {
		t.Fatalf("CreateSandbox(%s): %v", sb.ID, err)
	}
}

// mustTransition moves sandbox id to state to from any non-terminal state and fails the test
// unless it moved.
func mustTransition(t *testing.T, s berth.Store, id string, to berth.SandboxState, reason string, now time.Time) {
	t.Helper()
	ok, err := s.TransitionSandbox(t.Context(), id, nil, to, reason, "test", now)
	if err != nil || !ok {
		t.Fatalf("TransitionSandbox(%s → %s) = %v, %v; want true, nil", id, to, ok, err)
	}
}

// reservation returns a ledger entry fixture taken at now with a 60 s TTL (LED-2).
func reservation(id, agent, sid string, mib int64, now time.Time) berth.Reservation {
	return berth.Reservation{
		ID: id, AgentID: agent, SandboxID: sid, MiB: mib, Owner: "replica-1",
		CreatedAt: now, ExpiresAt: now.Add(60 * time.Second),
	}
}

// mustReserve takes r at now and fails the test unless it was taken.
func mustReserve(t *testing.T, s berth.Store, r berth.Reservation, now time.Time) {
	t.Helper()
	ok, err := s.Reserve(t.Context(), r, now)
	if err != nil || !ok {
		t.Fatalf("Reserve(%s, %d MiB) = %v, %v; want true, nil", r.ID, r.MiB, ok, err)
	}
}

// events returns the events matching f.
func events(t *testing.T, s berth.Store, f berth.EventFilter) []berth.Event {
	t.Helper()
	evs, err := s.Events(t.Context(), f)
	if err != nil {
		t.Fatalf("Events(%+v): %v", f, err)
	}
	return evs
}

// wantEvents compares the events of entity (exact, or a prefix ending in "/") with want.
func wantEvents(t *testing.T, s berth.Store, entity string, want []berth.Event) {
	t.Helper()
	got := events(t, s, berth.EventFilter{Entity: entity})
	if diff := cmp.Diff(want, got, eventOpts); diff != "" {
		t.Errorf("Events(%q) mismatch (-want +got):\n%s", entity, diff)
	}
}

// reservationIDs returns the ids of every reservation in the ledger, sorted.
func reservationIDs(t *testing.T, s berth.Store) []string {
	t.Helper()
	rs, err := s.Reservations(t.Context())
	if err != nil {
		t.Fatalf("Reservations: %v", err)
	}
	ids := make([]string, 0, len(rs))
	for _, r := range rs {
		ids = append(ids, r.ID)
	}
	slices.Sort(ids)
	return ids
}

// wantNotFound fails the test unless err wraps berth.ErrNotFound.
func wantNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, berth.ErrNotFound) {
		t.Errorf("%s: err = %v, want one wrapping berth.ErrNotFound", what, err)
	}
}
