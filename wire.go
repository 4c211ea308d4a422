package berth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

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
	// HeaderNodeToken authenticated the server to an agent's internal API with the node token
	// itself (AGT-5), before HeaderAgentCall; agents still accept it from older servers.
	HeaderNodeToken = "X-Node-Token"
	// HeaderAgentCall authenticates the server to one agent's internal API (AGT-5, issue 15):
	// AgentCallToken of the node token and that agent's address.
	HeaderAgentCall = "X-Berth-Agent-Call"
	// HeaderRequestID echoes the request id that also appears in error bodies and logs.
	HeaderRequestID = "X-Request-Id"
	// HeaderTimeout is how long a server waits for an agent's answer, in whole milliseconds,
	// sent on every call that has a deadline. An agent bounds a checkpoint by it (PAUSE-1),
	// so none runs on after the server gave up; agents of older releases ignore it.
	HeaderTimeout = "X-Berth-Timeout-Ms"
)

// ErrorBody is the JSON body of every non-2xx answer (API-2):
// {"error":{"code","message","retryable","retry_after_s","request_id","hosts"?}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ParseErrorBody reads b as an ErrorBody; ok is false unless it is one: JSON with a non-empty
// error code. Every reader of Berth's answers (the SDK, a replica reading its agents, the
// bench) tells Berth's own error from anything else in front of it (a proxy's page) so.
func ParseErrorBody(b []byte) (ErrorBody, bool) {
	var eb ErrorBody
	err := json.Unmarshal(b, &eb)
	return eb, err == nil && eb.Error.Code != ""
}

// ParseExecResult reads b, the body of an exec's 200, as an ExecResult; the error says why
// it is not one. An exec result is a JSON object whose "exit_code" member is a JSON number
// with an integer value (1 and 1.0 alike) of magnitude at most MaxExecExitCode; its "stdout"
// and "stderr", when present and not null, are strings. Anything else — null, {}, [],
// {"stdout":"x"}, {"exit_code":"0"}, {"exit_code":1.5} — is not a result: decoded straight
// into an ExecResult, null, {} and {"stdout":"x"} read as exit code 0, a command that
// succeeded, when what the command did is unknown. Every reader of an exec's answer in Go (a
// replica reading its agent's, the Go SDK and so the CLI reading a replica's) decides with
// this function, and makes anything else outcome_unknown (EOutcomeUnknown): the exec was
// sent and may have run. The Python SDK (ExecResult.from_answer) and the TypeScript SDK
// (execResult) check the same shape.
func ParseExecResult(b []byte) (ExecResult, error) {
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return ExecResult{}, errors.New(notAnObject(t))
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return ExecResult{}, fmt.Errorf("the body is not JSON: %w", err)
	}
	raw, ok := m["exit_code"]
	if !ok {
		return ExecResult{}, errors.New("it has no exit_code")
	}
	code, ok := jsonInteger(raw)
	if !ok {
		if len(raw) > 40 {
			raw = append(raw[:40:40], "…"...)
		}
		return ExecResult{}, fmt.Errorf("its exit_code %s is not an integer", raw)
	}
	res := ExecResult{ExitCode: code}
	for _, f := range []struct {
		name string
		to   *string
	}{{"stdout", &res.Stdout}, {"stderr", &res.Stderr}} {
		if v, ok := m[f.name]; ok {
			if err := json.Unmarshal(v, f.to); err != nil {
				return ExecResult{}, fmt.Errorf("its %s is not a string", f.name)
			}
		}
	}
	return res, nil
}

// MaxExecExitCode is the largest magnitude of an exec result's exit_code, 2^53−1: the
// largest integer every SDK's numbers hold exactly (a JavaScript number's), so the Go,
// Python and TypeScript SDKs agree on what an exec result is. Real exit codes are far
// smaller (0…255, −1 for a command that timed out).
const MaxExecExitCode = 1<<53 - 1

// jsonInteger returns the value of raw, one JSON value, when it is a number with an integer
// value of magnitude at most MaxExecExitCode. It reads the number as a float64, as
// JavaScript does, so 1.0 and 1e2 are integers and the SDKs decide alike.
func jsonInteger(raw json.RawMessage) (int, bool) {
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return 0, false // a string, null, true/false, an object or an array
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > MaxExecExitCode {
		return 0, false
	}
	return int(f), true
}

// notAnObject names what t, a body's text from its first non-space byte, is instead of a
// JSON object.
func notAnObject(t []byte) string {
	switch {
	case len(t) == 0:
		return "the body is empty"
	case string(bytes.TrimRight(t, " \t\r\n")) == "null":
		return "the body is null"
	case t[0] == '[':
		return "the body is an array"
	}
	return "the body is not a JSON object"
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
	// TTLMS is the sandbox's TTL left, in milliseconds, when the server sent the create (0:
	// none sent; the agent then goes by ExpiresAt). The agent counts it from the create's
	// arrival on its own monotonic clock, so its TTL stop (AGT-7) does not depend on how far
	// its wall clock is from the server's (C32); ExpiresAt is the same instant on the
	// server's clock. Negative is refused (invalid_request).
	TTLMS int64 `json:"ttl_ms,omitempty"`
	// Volume is "<tenant>/<name>" of the volume the sandbox mounts, if any (POOL-2).
	Volume string `json:"volume,omitempty"`
	// RestoreImage, when set, names a checkpoint image in the snapshot store: the agent
	// restores the sandbox from it (processes and memory as they were) instead of starting
	// it fresh (PAUSE-1, SPOT-3). Only agents whose runtime can checkpoint accept it.
	RestoreImage string `json:"restore_image,omitempty"`
}

// CheckpointRequest is the body of the agent's POST /internal/sandboxes/{id}/checkpoint
// (PAUSE-1, PAUSE-2): checkpoint the sandbox into the snapshot store under Image, then stop
// it and free what it held.
type CheckpointRequest struct {
	Image string `json:"image"`
}

// CheckpointResult is the answer of a checkpoint: the image's name; ImageBytes, the size of
// the runtime's image files; StoredBytes, what went into the snapshot store (zero chunks and
// chunks already stored skipped, SPOT-4); ResidentMiB, the guest's working set when it was
// checkpointed; and how long the checkpoint and the upload took, in milliseconds.
type CheckpointResult struct {
	Image        string `json:"image"`
	ImageBytes   int64  `json:"image_bytes"`
	StoredBytes  int64  `json:"stored_bytes"`
	ZeroChunks   int    `json:"zero_chunks"`
	ResidentMiB  int64  `json:"resident_mb"`
	CheckpointMS int64  `json:"checkpoint_ms"`
	UploadMS     int64  `json:"upload_ms"`
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

// AgentCallToken is what the servers present, in HeaderAgentCall, to agent agentID whose
// internal API is at address (its announced base URL, "https://host:port"): the hex
// HMAC-SHA256 of the id and the address, keyed by the node token (64 hex digits). The agent
// checks it against its own id and address. A server sends it instead of the node token, so
// whoever makes a replica call an address of their choosing (an agent credential can
// announce any address) learns a token good for that id at that address only — never the
// fleet's join token — and an agent announcing another agent's address gets no call
// through: the token names the announcer's id (issue 15, docs/DECISIONS.md "Trust model").
func AgentCallToken(nodeToken, agentID, address string) string {
	m := hmac.New(sha256.New, []byte(nodeToken))
	m.Write([]byte("berth agent call\x00" + agentID + "\x00" + address))
	return hex.EncodeToString(m.Sum(nil))
}
