package berth

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// AgentStatus is the status an agent declares (LIF-1). Stale and dead are derived from the
// heartbeat age, never stored.
type AgentStatus string

// Agent statuses (LIF-1).
const (
	AgentActive      AgentStatus = "active"
	AgentDraining    AgentStatus = "draining"
	AgentStale       AgentStatus = "stale"       // derived: no heartbeat for the staleness cutoff
	AgentQuarantined AgentStatus = "quarantined" // derived: out of placement after failed creates (PLC-9)
	AgentDead        AgentStatus = "dead"        // derived: no heartbeat for dead_after
)

// Admission modes (ADM-1).
const (
	AdmissionCommitted  = "committed"
	AdmissionWorkingSet = "working-set"
	AdmissionNone       = "none"
)

// MaxRegionBytes bounds a region's name, as a host announces it (Heartbeat.Region, `berth
// agent --region`) and as a create asks for it: a longer one is refused (invalid_request) on
// both sides, so a host can never announce a region no create could name.
const MaxRegionBytes = 64

// Pools (POOL-1).
const (
	PoolStateful  = "stateful"
	PoolEphemeral = "ephemeral"
)

// HeldSandbox is one sandbox an agent holds, as listed on its heartbeat (AGT-1): every guest
// its admittable charges, so the ledger nets each create exactly when the agent starts
// counting it (LED-4). ResidentMiB is the measured working set in MiB; Measured is false
// until a measurement saw the guest (while false the agent charges the reserve, ADM-5);
// Starting is true while the runtime is still starting it (it does not run yet, so the
// store must not call it running).
type HeldSandbox struct {
	ID          string `json:"id"`
	ResidentMiB int64  `json:"resident_mb"`
	Measured    bool   `json:"measured"`
	Starting    bool   `json:"starting,omitempty"`
	// OOMKills counts processes the kernel OOM killer killed in the sandbox (C09); with
	// ADM-9 working it stays 0.
	OOMKills int64 `json:"oom_kills,omitempty"`
	// Incarnation is the agent's number for this copy of the sandbox within its boot
	// (Heartbeat.BootID), from 1: a new one each time the agent books it (a create or a
	// restore) or a create re-confirms a copy it already held. A server that finds the copy
	// stale (AGT-6: the store places the sandbox on another host, or on none) stops it with
	// DELETE …?boot=B&incarnation=N, which spares a copy placed here again since, in this
	// boot or a later one. 0 from an agent that does not number them; such a copy is never
	// stopped as stale.
	Incarnation int64 `json:"incarnation,omitempty"`
}

// HeldCopy names one copy of a sandbox on an agent: its id, and the agent's boot and
// incarnation of it (HeldSandbox.Incarnation, numbered within Boot; 0 when the agent does not
// number them).
type HeldCopy struct {
	ID          string
	Boot        string
	Incarnation int64
}

// HeldCheck is what the store says of the sandboxes an agent holds (AGT-6). Ended are
// terminal or unknown to the store: the agent stops them. Stale are live but placed on
// another agent or on none (paused): the agent's copy is left over from a create or
// checkpoint whose answer was lost, and it is stopped only while it is the boot and
// incarnation checked (DELETE …?boot=B&incarnation=N). Both are ordered as checked.
type HeldCheck struct {
	Ended []string
	Stale []HeldCopy
}

// EndedSandbox reports a sandbox the agent ended on its own (TTL, exit, eviction) so the
// store can record the transition. It is repeated on every heartbeat until one is accepted.
type EndedSandbox struct {
	ID     string       `json:"id"`
	State  SandboxState `json:"state"`
	Reason string       `json:"reason"`
	// At is the agent's clock when it ended the sandbox, for operators only: the store
	// records the transition and its event at the server's receive time (C32).
	At time.Time `json:"at"`
}

// Heartbeat is what an agent posts every interval (AGT-1). Memory figures are MiB, CPU
// figures are cores. MemoryMiBAdmittable is the agent's own verdict computed with the one
// admission formula (ADM-6); the scheduler only subtracts its pending reservations from it.
// The server refuses (400 invalid_request) figures no host has: memory outside 0–2⁴⁰ MiB,
// CPU outside 0–65,536 cores, MemoryPressure outside 0–100 (PSI percent), negative counts.
type Heartbeat struct {
	AgentID     string `json:"agent_id"`
	Address     string `json:"address"` // base URL of the agent's internal API
	Region      string `json:"region"`
	Pool        string `json:"pool"`
	Preemptible bool   `json:"preemptible"`
	// HeartbeatAt is the agent's wall clock when it built the heartbeat: shown to operators,
	// never used for a decision (C32: staleness, leases and event times use the server's
	// receive time, Agent.LastSeen; ordering uses Seq).
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// Seq numbers the heartbeats of one boot (BootID) from 1 up, never repeating: the store
	// applies a heartbeat's figures only if its Seq is above the last one applied for that
	// boot, so a slow POST overtaken by a newer heartbeat does not roll them back, whatever
	// the agent's clock says (C32). 0 (an agent that does not number them) is applied in the
	// order heartbeats arrive; a negative Seq is refused (invalid_request).
	Seq    int64       `json:"seq,omitempty"`
	Status AgentStatus `json:"status"`
	// StatusReason says why a draining agent drains — "aws rebalance notice", an operator's
	// reason, "agent shutting down" — and becomes the reason of the event its status change
	// writes (LIF-3: "heartbeat: <reason>"). It is not stored on the agent; the server keeps
	// its first 512 bytes (server.ReasonExcerptBytes). "" (an agent of the previous release)
	// writes "heartbeat" alone.
	StatusReason        string         `json:"status_reason,omitempty"`
	CPUTotal            float64        `json:"cpu_total"`
	CPUUsed             float64        `json:"cpu_used"`
	MemoryMiBTotal      int64          `json:"memory_mb_total"`
	MemoryMiBUsed       int64          `json:"memory_mb_used"`
	MemoryMiBCommitted  int64          `json:"memory_mb_committed"`
	MemoryAdmission     string         `json:"memory_admission"`
	MemoryMiBAdmittable int64          `json:"memory_mb_admittable"`
	IntakeOpen          bool           `json:"intake_open"`
	MemoryPressure      float64        `json:"memory_pressure"`
	StartsInFlight      int            `json:"starts_in_flight"`
	Sandboxes           []HeldSandbox  `json:"sandboxes"`
	Ended               []EndedSandbox `json:"ended,omitempty"`
	Version             string         `json:"version"`
	BootID              string         `json:"boot_id"`
	// MeasurementErrors counts resident readings clamped into [0, total] (C07).
	MeasurementErrors int64 `json:"measurement_errors,omitempty"`
	// Runtime names the agent's runtime driver ("gvisor", "process", "noop") and Checkpoint
	// says whether it can checkpoint and restore guests (ISO-4): only such agents take a
	// resume or a moved guest, and only their guests are snapshot-moved under a notice.
	Runtime    string `json:"runtime,omitempty"`
	Checkpoint bool   `json:"checkpoint,omitempty"`
	// Delta marks a heartbeat whose Sandboxes lists only the sandboxes added or changed since
	// the heartbeat of this boot numbered BaseSeq, which the server acknowledged
	// (HeartbeatAck), and whose Removed lists the ids held then and not now (issue 16, goal 2).
	// Every other field is whole. The server applies a delta only onto exactly that base;
	// otherwise it applies nothing but Ended and answers Resync. A heartbeat without Delta
	// (every agent of the previous release) lists everything held, as before.
	Delta   bool     `json:"delta,omitempty"`
	BaseSeq int64    `json:"base_seq,omitempty"`
	Removed []string `json:"removed,omitempty"`
}

// HeartbeatAck is the answer to POST /v1/agents/heartbeat (200; issue 16, goal 2). Seq is the
// heartbeat the server applied, whose held list it now keeps: the agent may send its next
// heartbeat as a delta with BaseSeq = Seq. Seq is 0 and Resync true when the server did not
// apply the figures (a delta whose base it does not hold, or a heartbeat overtaken by a newer
// one; hb.Ended is applied either way): the agent must send its whole list next.
type HeartbeatAck struct {
	Seq    int64 `json:"seq"`
	Resync bool  `json:"resync,omitempty"`
}

// HeartbeatResult is what a store did with one heartbeat (AgentStore.RecordHeartbeat).
// Applied is false, and Resync true, when it applied only hb.Ended (hb overtaken, or a delta
// onto another base). Agent is the stored agent after the write, without its
// held list (Sandboxes is empty: read Agent for it). Netted counts reservations released (LED-4).
type HeartbeatResult struct {
	Applied bool
	Resync  bool
	Netted  int
	Agent   Agent
}

// Overtaken reports whether h is older than the heartbeat a store already applied for its
// agent, of boot appliedBoot with sequence number appliedSeq (C32): the same boot, and a Seq
// that is not above the applied one. The order is the agent's sequence number, never its
// clock. An unnumbered heartbeat (Seq 0) is never overtaken (applied in arrival order), and
// a new boot starts over.
func (h Heartbeat) Overtaken(appliedBoot string, appliedSeq int64) bool {
	return appliedBoot == h.BootID && h.Seq > 0 && h.Seq <= appliedSeq
}

// AgentChanges is one read of the agent table by AgentStore.AgentsChangedSince.
type AgentChanges struct {
	// Agents are the agents read, without held lists, in no particular order.
	Agents []Agent
	// Full says Agents is every agent; otherwise it is those changed since the cursor given.
	Full bool
	// Cursor is what the next read passes to get the changes after this one ("": none,
	// the next read is whole). It is opaque and means nothing to another store.
	Cursor string
}

// Agent is the store's record of an agent: its latest heartbeat, when the server received it,
// and the status an operator set (a drain marked through the API sticks until undrain).
type Agent struct {
	Heartbeat
	// LastSeen is the server's clock when the latest heartbeat arrived; staleness is judged
	// against it, never against the agent's clock.
	LastSeen time.Time `json:"-"`
	// DrainReason is set while an operator drain is in force.
	DrainReason string `json:"drain_reason,omitempty"`
	// CreateFailures counts consecutive creates that failed on the host after admission;
	// QuarantinedUntil, when in the future, keeps the host out of placement (PLC-9, C19).
	CreateFailures   int       `json:"create_failures"`
	QuarantinedUntil time.Time `json:"quarantined_until,omitzero"`
	// LastSeenS is the heartbeat age in seconds, filled in for API answers only (§13).
	LastSeenS float64 `json:"last_seen_s"`
	// HeldCount is how many sandboxes the latest heartbeat holds, filled in for API answers
	// only: with GET /v1/agents?held=count it is there and Sandboxes is empty.
	HeldCount int `json:"held_count"`
}

// QuarantinePolicy says when a host that keeps failing creates leaves placement (PLC-9):
// after After consecutive failures, for Backoff, doubled for every further failure (a failure
// on probation) up to MaxBackoff.
type QuarantinePolicy struct {
	After      int
	Backoff    time.Duration
	MaxBackoff time.Duration
}

// Until returns when a host with failures consecutive failures may take creates again, or the
// zero time when it is not quarantined.
func (q QuarantinePolicy) Until(failures int, now time.Time) time.Time {
	if q.After <= 0 || failures < q.After {
		return time.Time{}
	}
	d := q.Backoff
	for i := q.After; i < failures && d < q.MaxBackoff; i++ {
		d *= 2
	}
	return now.Add(min(d, max(q.MaxBackoff, q.Backoff)))
}

// QuarantineChange is what one create outcome does to an agent's quarantine state: the new
// consecutive-failure count and quarantine end, and, when From/To are set, the event to write.
type QuarantineChange struct {
	Failures         int
	Until            time.Time
	From, To, Reason string
}

// Apply is the PLC-9 state machine every store runs: a failure counts, and from the After-th
// on quarantines (again, longer, on probation); a success resets the count and, after a
// quarantine, says the agent is back.
func (q QuarantinePolicy) Apply(failures int, until time.Time, failed bool, now time.Time) QuarantineChange {
	if !failed {
		if q.After > 0 && failures >= q.After {
			return QuarantineChange{From: string(AgentQuarantined), To: string(AgentActive), Reason: "a create succeeded on probation"}
		}
		return QuarantineChange{}
	}
	failures++
	next := q.Until(failures, now)
	if next.IsZero() {
		return QuarantineChange{Failures: failures, Until: until}
	}
	return QuarantineChange{Failures: failures, Until: next, From: string(AgentActive), To: string(AgentQuarantined),
		Reason: fmt.Sprintf("%d consecutive creates failed; on probation from %s", failures, next.UTC().Format(time.RFC3339))}
}

// DrainStatus answers GET /v1/agents/{id}/drain (AGT-5, C11, C12). A drain is complete only
// when every sandbox on the host is terminal; past its deadline, Remaining names what blocks
// it and Blocked is true, so a drain never hangs silently.
type DrainStatus struct {
	AgentID   string        `json:"agent_id"`
	Draining  bool          `json:"draining"`
	Reason    string        `json:"reason,omitempty"`
	Since     time.Time     `json:"since,omitzero"`
	Deadline  time.Time     `json:"deadline,omitzero"`
	Complete  bool          `json:"complete"`
	Blocked   bool          `json:"blocked"`
	Remaining []DrainRemain `json:"remaining"`
}

// DrainRemain is one sandbox a drain still waits for.
type DrainRemain struct {
	ID    string       `json:"id"`
	State SandboxState `json:"state"`
}

// NewOOMKills compares two heartbeats' held sandboxes and returns, per sandbox, how many
// more processes the kernel OOM killer killed since the earlier one (C09). Stores turn each
// into an event.
func NewOOMKills(before, now []HeldSandbox) map[string]int64 {
	old := make(map[string]int64, len(before))
	for _, h := range before {
		old[h.ID] = h.OOMKills
	}
	var grew map[string]int64
	for _, h := range now {
		if d := h.OOMKills - old[h.ID]; d > 0 {
			if grew == nil {
				grew = map[string]int64{}
			}
			grew[h.ID] = d
		}
	}
	return grew
}

// CheckAgentID refuses an agent id that is not 1–128 bytes of ASCII letters, digits and
// '.', '-', '_', ':' (a host name fits; control characters, separators and '/' do not, so an
// id is one unambiguous field in call tokens, paths and logs: issue 15). The error is
// invalid_request.
func CheckAgentID(id string) error {
	ok := id != "" && len(id) <= 128
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_' || c == ':'
	}
	if !ok {
		return Errorf(EInvalidRequest, "agent_id %q must be 1–128 characters of letters, digits, '.', '-', '_' and ':'", id)
	}
	return nil
}

// MaxReasonBytes bounds a reason an operator gives a drain (AGT-5), in bytes: 512, the bound
// the reasons of apps' events get (the server's ReasonExcerptBytes is this constant).
const MaxReasonBytes = 512

// CheckReason refuses drain reason text that an event could not keep whole: more than
// MaxReasonBytes bytes, a NUL character (PostgreSQL takes none in text) or bytes that are not
// UTF-8. The server checks the reason of POST /v1/agents/{id}/drain with it and the agent the
// one its /internal/drain?reason= is given, so a reason is held to one bound on both sides.
// The error is invalid_request.
func CheckReason(reason string) error {
	switch {
	case len(reason) > MaxReasonBytes:
		return Errorf(EInvalidRequest, "reason is %d bytes; it must be at most %d", len(reason), MaxReasonBytes)
	case strings.IndexByte(reason, 0) >= 0 || !utf8.ValidString(reason):
		return Errorf(EInvalidRequest, "reason must be UTF-8 text without a NUL character")
	}
	return nil
}
