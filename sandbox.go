package berth

import (
	"cmp"
	"strings"
	"time"
)

// SandboxState is the lifecycle state of a sandbox (SPEC LIF-1).
type SandboxState string

// Sandbox states (LIF-1): pending → starting → running → stopping → stopped, or one of the
// other terminal states.
const (
	SandboxPending  SandboxState = "pending"
	SandboxStarting SandboxState = "starting"
	SandboxRunning  SandboxState = "running"
	SandboxStopping SandboxState = "stopping"
	SandboxStopped  SandboxState = "stopped"
	SandboxFailed   SandboxState = "failed"
	SandboxLost     SandboxState = "lost"
	SandboxEvicted  SandboxState = "evicted"
	// Evacuation (SPOT-3): evacuating → reconstructed (recreated elsewhere from its template),
	// or snapshotting → resuming → running on another host (its snapshot moved, the same
	// sandbox id), or lost as a budgeted loss. Migrated is kept in the contract; Berth's
	// moves keep the sandbox's id instead of ending it (docs/DECISIONS.md).
	SandboxEvacuating    SandboxState = "evacuating"
	SandboxReconstructed SandboxState = "reconstructed"
	SandboxMigrated      SandboxState = "migrated"
	// Pause and resume (PAUSE-1): running → pausing → paused (no host, no memory, its image
	// in the snapshot store, its TTL clock stopped) → resuming → running on the host
	// placement picked. Snapshotting is the checkpoint of an evacuation's move (PAUSE-2).
	SandboxPausing      SandboxState = "pausing"
	SandboxPaused       SandboxState = "paused"
	SandboxResuming     SandboxState = "resuming"
	SandboxSnapshotting SandboxState = "snapshotting"
)

// SandboxStates lists every sandbox state (LIF-1), in lifecycle order.
var SandboxStates = []SandboxState{
	SandboxPending, SandboxStarting, SandboxRunning, SandboxStopping, SandboxStopped,
	SandboxFailed, SandboxLost, SandboxEvicted, SandboxEvacuating, SandboxReconstructed, SandboxMigrated,
	SandboxPausing, SandboxPaused, SandboxResuming, SandboxSnapshotting,
}

// SandboxStateList is SandboxStates for a person, in lifecycle order: "pending, starting, …,
// snapshotting" — what a refused state filter lists as the ones it takes.
func SandboxStateList() string {
	names := make([]string, len(SandboxStates))
	for i, s := range SandboxStates {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// Terminal reports whether no further transition leaves s.
func (s SandboxState) Terminal() bool {
	switch s {
	case SandboxStopped, SandboxFailed, SandboxLost, SandboxEvicted, SandboxReconstructed, SandboxMigrated:
		return true
	}
	return false
}

// FreesIdempotencyKey reports whether the move from s to to ends a create that never ran —
// failed from pending or starting — which frees the create's Idempotency-Key so a retry with
// it can create anew (API-4). A sandbox that ran and then failed keeps its key: a replay
// answers it, as the first create was answered (C26).
func (s SandboxState) FreesIdempotencyKey(to SandboxState) bool {
	return to == SandboxFailed && (s == SandboxPending || s == SandboxStarting)
}

// Valid reports whether s is one of the known states.
func (s SandboxState) Valid() bool {
	switch s {
	case SandboxPending, SandboxStarting, SandboxRunning, SandboxStopping,
		SandboxStopped, SandboxFailed, SandboxLost, SandboxEvicted,
		SandboxEvacuating, SandboxReconstructed, SandboxMigrated,
		SandboxPausing, SandboxPaused, SandboxResuming, SandboxSnapshotting:
		return true
	}
	return false
}

// Sandbox is the record of one sandbox as the store and the API see it (SPEC §13 sandbox
// object). MemoryMiB is the configured size in MiB.
type Sandbox struct {
	ID        string            `json:"id"`
	Template  string            `json:"template"`
	Tenant    string            `json:"tenant"`
	AgentID   string            `json:"agent_id"`
	State     SandboxState      `json:"state"`
	MemoryMiB int64             `json:"memory_mb"`
	VCPUs     int               `json:"vcpus"`
	Stateful  bool              `json:"stateful"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// Reason explains the latest transition (e.g. "ttl", "deleted", "agent refused").
	Reason string `json:"reason,omitempty"`
	// Volume is the name of the tenant's volume the sandbox mounts, if any (POOL-2).
	Volume string `json:"volume,omitempty"`
	// PausedAt is when a paused sandbox was paused (its TTL clock stopped then; a resume moves
	// ExpiresAt on by the time paused); zero otherwise (PAUSE-1).
	PausedAt time.Time `json:"paused_at,omitzero"`
	// Image names the checkpoint image of a paused sandbox in the snapshot store; never
	// serialised.
	Image string `json:"-"`
	// IdempotencyKey is the create's Idempotency-Key (API-4); never serialised.
	IdempotencyKey string `json:"-"`
	// RequestHash is RequestHash of the create that holds IdempotencyKey, so a retry with
	// the same key and a different request is told so (C26); never serialised.
	RequestHash string `json:"-"`
}

// Template is a named sandbox image with a baked memory size in MiB and vCPU count.
type Template struct {
	Name      string `json:"name"`
	MemoryMiB int64  `json:"memory_mb"`
	VCPUs     int    `json:"vcpus"`
}

// MinSandboxMiB is the least memory, in MiB, a sandbox may have: the floor of memory_mb for a
// create, an app's spec and a template. It is twice the smallest size at which every runtime
// Berth ships starts a guest that runs python: gVisor (runsc 20221219, ptrace) never boots
// at 8 MiB, boots and is killed at once at 16, runs sh but not python at 24, and runs both at
// 32 with about 20 MiB resident (the sentry and the gofer, charged to the sandbox's cgroup);
// the isolated process runtime never starts at 1–2 MiB, runs sh at 4 and python at 8. A start
// below what the runtime needs fails on every host, and each such failure would count toward
// that host's quarantine (PLC-9): a tenant's own bad request could take the whole fleet out of
// placement. So the API refuses a smaller size (400 invalid_request), an agent refuses to
// start one (invalid_request, which no host's quarantine counts), and a template or an app
// spec stored before the floor existed is raised to it when used (SandboxMiB).
const MinSandboxMiB = 64

// SandboxMiB is the memory size in MiB of a sandbox that asks for asked MiB (0: the
// template's, templateMiB): never below MinSandboxMiB, so a template or an app spec stored
// below the floor still starts.
func SandboxMiB(asked, templateMiB int64) int64 {
	return max(cmp.Or(asked, templateMiB), MinSandboxMiB)
}

// CreateRequest is the body of POST /v1/sandboxes (SPEC §13). MemoryMiB and VCPUs, when set,
// override the template's; TTLSeconds bounds the sandbox's life (AGT-7).
type CreateRequest struct {
	Template   string            `json:"template"`
	MemoryMiB  int64             `json:"memory_mb,omitempty"`
	VCPUs      int               `json:"vcpus,omitempty"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty"`
	Stateful   bool              `json:"stateful,omitempty"`
	Volume     string            `json:"volume,omitempty"`
	Region     string            `json:"region,omitempty"`
	Pool       string            `json:"pool,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

// MaxJSONBodyBytes is the most bytes a JSON request body may have, on the API and on an
// agent's internal API, heartbeats (8 MiB) and the execs a replica forwards (re-encoded, up to
// three times larger) excepted: 1 MiB (1,048,576 bytes). A larger body
// is refused with 413 request_too_large and nothing is done. An exec's Stdin counts within its
// body as a JSON string, escaped (a control character or one of <, >, & takes 6 bytes).
const MaxJSONBodyBytes = 1 << 20

// MaxExecTimeoutS is the largest TimeoutS an exec takes, seconds; more is 400 invalid_request.
const MaxExecTimeoutS = 3600

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. TimeoutS is in seconds
// (0: the server's default, 60; at most MaxExecTimeoutS). Stdin is the command's whole
// standard input, text; the body, Stdin included, is at most MaxJSONBodyBytes as JSON.
type ExecRequest struct {
	Cmd      []string `json:"cmd"`
	Stdin    string   `json:"stdin,omitempty"`
	TimeoutS int      `json:"timeout_s,omitempty"`
}

// ExecResult is the answer of an exec: the exit code and the captured output (each capped).
// Readers decode it with ParseExecResult, which reads these three fields by name: a field
// added here must be added there too.
type ExecResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// EvacuateStep is one step of an evacuation plan the agent sends (SPOT-3): action is
// "reconstruct", "snapshot_move" or "loss".
type EvacuateStep struct {
	SandboxID string `json:"sandbox_id"`
	Action    string `json:"action"`
	Reason    string `json:"reason"`
}

// EvacuateRequest is the body of POST /v1/agents/{id}/evacuate (node token): the plan the
// agent's triage made, to carry out within DeadlineInMS milliseconds of its arrival (0..1 day;
// the agent measures it on its own monotonic clock when it sends the plan, and the server
// counts it from when it receives it). Deadline is the same instant on the agent's wall clock,
// for logs only: no server decision depends on the agent's clock (C32). A plan without
// DeadlineInMS gets DefaultEvacuateWindow.
type EvacuateRequest struct {
	Deadline     time.Time      `json:"deadline"`
	DeadlineInMS int64          `json:"deadline_in_ms,omitempty"`
	Steps        []EvacuateStep `json:"steps"`
}

// DefaultEvacuateWindow is the time the server gives an evacuation plan that carries no
// relative deadline (an agent that sends only its wall-clock Deadline): the window the agent
// itself assumes for a notice without a deadline, and GCP's and Azure's preemption windows.
const DefaultEvacuateWindow = 30 * time.Second

// EvacuateOutcome is what became of one sandbox: its final state and, when reconstructed,
// its replacement.
type EvacuateOutcome struct {
	SandboxID   string       `json:"sandbox_id"`
	State       SandboxState `json:"state"`
	Replacement string       `json:"replacement,omitempty"`
	Reason      string       `json:"reason"`
}
