package berth

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Error codes are stable strings that clients branch on (SPEC API-2). They never change
// meaning; new codes may be added.
const (
	ENoCapacity          = "no_capacity"              // 503: live hosts exist but none fits (PLC-4), retryable
	ENoHealthyAgents     = "no_healthy_agents"        // 503: no live candidate at all (PLC-4), retryable, pages a human
	EHostStartsSaturated = "host_starts_saturated"    // 503: the agent's start semaphore is full (ADM-10), retryable
	ETenantOverQuota     = "tenant_over_quota"        // 403: tenant quota reached (ADM-11), not retryable
	ETemplateNotFound    = "template_not_found"       // 404
	ESandboxNotFound     = "sandbox_not_found"        // 404
	ENotFound            = "not_found"                // 404: any other missing entity (agent, tenant, route)
	EInvalidRequest      = "invalid_request"          // 400: malformed or out-of-range input
	EUnauthorized        = "unauthorized"             // 401: missing or wrong key
	EForbidden           = "forbidden"                // 403: key valid but lacks the role
	EConflict            = "conflict"                 // 409: state does not allow the call
	ETooLarge            = "request_too_large"        // 413: body over the limit
	EUnavailable         = "unavailable"              // 503: a dependency (store, agent) failed transiently
	EInternal            = "internal"                 // 500: a bug; never caused by input
	EServiceRunning      = "service_running"          // 409: the sandbox already runs its service (APP-1)
	EServiceExited       = "service_exited"           // 502: the sandbox's service has exited (APP-2)
	EUpstream            = "app_unreachable"          // 502: nothing answers on the app's port inside the sandbox
	EUnsupported         = "unsupported"              // 501: the agent's runtime cannot do this (noop runtime)
	EAppNotFound         = "app_not_found"            // 404
	EAppStopped          = "app_stopped"              // 409: the app is stopped by its owner; requests do not wake it
	EAppError            = "app_error"                // 502: the app is in error (a fault a retry cannot fix)
	EWakeTimeout         = "app_wake_timeout"         // 503: the app did not come up within the wake timeout, retryable
	EIdempotencyMismatch = "idempotency_key_mismatch" // 422: the Idempotency-Key was first used with another request (API-4, C26)
	ERateLimited         = "rate_limited"             // 429: the tenant is over its request rate, retryable after Retry-After
	EMethodNotAllowed    = "method_not_allowed"       // 405: the path is a route, not for this method; Allow lists those it takes
	EOutcomeUnknown      = "outcome_unknown"          // 504: an exec reached its host but no whole answer came back; it may have run, not retryable
)

// Error is the one error type of Berth (STYLE habit 4). The HTTP layer maps Code to a status
// in exactly one place (server.StatusFor); everything else wraps an *Error with %w.
type Error struct {
	Code    string
	Message string
	// RetryAfter is the server's estimate of when a retry may succeed (API-3); zero when the
	// error is not retryable or no estimate exists.
	RetryAfter time.Duration
	// Hosts counts the hosts per rejection reason for capacity refusals (PLC-10, C21). The key
	// "total" holds the number of hosts considered.
	Hosts map[string]int
	// Cause is the failure behind the error, for the logs and errors.Is/As (Unwrap); it
	// never reaches a client: the HTTP body carries Code and Message only.
	Cause error
}

// Error implements error: "code: message", then ": cause" when there is one (for logs; a
// client's body never holds it).
func (e *Error) Error() string {
	s := e.Code
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Unwrap returns the cause (nil if none), so errors.Is and errors.As see through an *Error.
func (e *Error) Unwrap() error { return e.Cause }

// Retryable reports whether a client should retry the call that produced this error: capacity
// refusals and transient unavailability (the "does not fit here" kind of no, STYLE habit 3).
func (e *Error) Retryable() bool {
	switch e.Code {
	case ENoCapacity, ENoHealthyAgents, EHostStartsSaturated, EUnavailable, EWakeTimeout, ERateLimited:
		return true
	}
	return false
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error with the given code, a formatted message and cause as its Cause:
// the message is what a client reads, the cause (for example a driver's text) stays in the
// logs.
func Wrap(code string, cause error, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Cause: cause}
}

// ErrorCode returns the code of the first *Error in err's chain, EInternal for any other
// non-nil error and "" for nil.
func ErrorCode(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return EInternal
}

// ErrorMessage returns the message of the first *Error in err's chain; for other errors it
// returns a generic text so internal details never reach a client.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}

// ServiceExitedMessage is service_exited's message (APP-2): the service's exit code and the
// tail of what it printed, or that it printed nothing (an empty tail read as a dangling
// "output tail:" in an app's reason).
func ServiceExitedMessage(code int, tail string) string {
	if strings.TrimSpace(tail) == "" {
		return fmt.Sprintf("the service exited with code %d and printed nothing", code)
	}
	return fmt.Sprintf("the service exited with code %d; output tail:\n%s", code, tail)
}
