package berth

import "time"

// HTTP headers of the v1 contract.
const (
	// HeaderIdempotencyKey makes a retried create return the first outcome (API-4).
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderFirstAttempt carries the RFC 3339 time of a create's first attempt, so the server
	// can measure time from first refusal to success (SDK-3, MET-4).
	HeaderFirstAttempt = "Berth-First-Attempt"
	// HeaderAttempt numbers a create's attempts from 1, so the server counts time to
	// success only for creates that were refused first (MET-4).
	HeaderAttempt = "Berth-Attempt"
	// HeaderNodeToken authenticates the server to an agent's internal API (AGT-5).
	HeaderNodeToken = "X-Node-Token"
	// HeaderRequestID echoes the request id that also appears in error bodies and logs.
	HeaderRequestID = "X-Request-Id"
)

// ErrorBody is the JSON body of every non-2xx answer (API-2):
// {"error":{"code","message","retryable","retry_after_s","request_id","hosts"?}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody. RetryAfterS is whole seconds (the same value as the
// Retry-After header); Hosts is the per-reason host count of capacity refusals (C21).
type ErrorDetail struct {
	Code        string         `json:"code"`
	Message     string         `json:"message"`
	Retryable   bool           `json:"retryable"`
	RetryAfterS int            `json:"retry_after_s"`
	RequestID   string         `json:"request_id"`
	Hosts       map[string]int `json:"hosts,omitempty"`
}

// AgentCreate is the body of the agent's internal POST /internal/sandboxes: the sandbox the
// scheduler placed there. The agent's local gate checks it again (AGT-2).
type AgentCreate struct {
	ID        string    `json:"id"`
	Template  string    `json:"template"`
	MemoryMiB int64     `json:"memory_mb"`
	VCPUs     int       `json:"vcpus"`
	Stateful  bool      `json:"stateful"`
	ExpiresAt time.Time `json:"expires_at"`
	// Volume is "<tenant>/<name>" of the volume the sandbox mounts, if any (POOL-2).
	Volume string `json:"volume,omitempty"`
}

// ServiceRequest is the body of the agent's internal POST /internal/sandboxes/{id}/service
// (APP-1): the long-running command of an app, started detached inside the sandbox (cwd the
// sandbox's working directory, its own process group). A sandbox runs at most one service.
type ServiceRequest struct {
	Cmd []string          `json:"cmd"`
	Env map[string]string `json:"env,omitempty"`
}

// ServiceStatus is the answer of the agent's GET /internal/sandboxes/{id}/service: whether
// the service started, whether it has exited and with which code, and the tail of its
// combined stdout and stderr (at most ServiceOutputTail bytes) so a command that exits at
// once can be reported with its reason (APP-2).
type ServiceStatus struct {
	Started  bool   `json:"started"`
	Exited   bool   `json:"exited"`
	ExitCode int    `json:"exit_code"`
	Output   string `json:"output,omitempty"`
}

// ServiceOutputTail is how many trailing bytes of a service's output are kept, bytes.
const ServiceOutputTail = 4096
