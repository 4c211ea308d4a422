package berth

import (
	"slices"
	"strings"
	"time"
)

// Event is one append-only record of a state transition (LIF-3): time, entity, from, to,
// reason and actor. Entity is "<kind>/<id>", e.g. "sandbox/sb-1", "agent/a1",
// "reservation/r-9".
type Event struct {
	ID     int64     `json:"id,omitempty"`
	At     time.Time `json:"at"`
	Entity string    `json:"entity"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Reason string    `json:"reason"`
	Actor  string    `json:"actor"`
}

// EventFilter selects events: every set field must match. Entity matches exactly, or as a
// prefix when it ends in "/" (e.g. "sandbox/"). Since is inclusive, Until exclusive; To
// selects transitions into one state (e.g. "lost"). Limit 0 means the store's default.
type EventFilter struct {
	Entity string
	Since  time.Time
	Until  time.Time
	To     string
	Limit  int
}

// eventKinds are the kinds of entity events are written for, in the order messages list them.
var eventKinds = []string{"sandbox", "agent", "reservation", "app", "tenant", "volume"}

// EventKinds lists the kinds of entity events are written for (LIF-3): an event's Entity is
// "<kind>/<id>" with one of them; a volume's id is "<tenant>/<name>".
func EventKinds() []string { return slices.Clone(eventKinds) }

// ValidEventKind reports whether kind is one of EventKinds.
func ValidEventKind(kind string) bool { return slices.Contains(eventKinds, kind) }

// EventKindsText is EventKinds as a message lists them: "sandbox, agent, …, tenant or volume".
func EventKindsText() string {
	return strings.Join(eventKinds[:len(eventKinds)-1], ", ") + " or " + eventKinds[len(eventKinds)-1]
}

// Reservation states its events move to (LED-1, LED-2, LED-4): "held" from the reserve
// until "released" (by its owner or a terminal sandbox), "netted" (a heartbeat accounts for
// the sandbox) or "expired" (swept after its TTL).
const (
	ReservationHeld     = "held"
	ReservationReleased = "released"
	ReservationNetted   = "netted"
	ReservationExpired  = "expired"
)

// Event To values that are not states: a sandbox's kernel OOM kill (it keeps running), an
// app's deletion, a tenant's quota set, a volume pinned to its host.
const (
	EventOOMKill    = "oom_kill"
	EventAppDeleted = "deleted"
	EventQuotaSet   = "quota"
	EventPinned     = "pinned"
)

// eventTos is every value an event's To can hold but the boot ids of an agent's restart.
var eventTos = func() []string {
	var tos []string
	for _, st := range SandboxStates {
		tos = append(tos, string(st))
	}
	for _, st := range []AgentStatus{AgentActive, AgentDraining, AgentStale, AgentQuarantined, AgentDead} {
		tos = append(tos, string(st))
	}
	for _, st := range []AppState{AppHibernated, AppWaking, AppDeploying, AppRunning, AppWaitingCapacity, AppStopped, AppError} {
		if !slices.Contains(tos, string(st)) { // running and stopped are sandbox states too
			tos = append(tos, string(st))
		}
	}
	return append(tos, ReservationHeld, ReservationReleased, ReservationNetted, ReservationExpired,
		EventOOMKill, EventAppDeleted, EventQuotaSet, EventPinned)
}()

// EventTos lists the states events move to (their To), each once: the sandbox states, the
// agent statuses, the app states, the reservation states and the Event* values. The one
// event whose To is no state — an agent's restart, From and To its old and new boot ids — is
// not among them.
func EventTos() []string { return slices.Clone(eventTos) }

// ValidEventTo reports whether to is one of EventTos.
func ValidEventTo(to string) bool { return slices.Contains(eventTos, to) }
