// Package httpjson holds the HTTP plumbing shared by the server's public API and the agent's
// internal API: the one code → status mapping (STYLE habit 4), error bodies (API-2) and
// strict, size-limited JSON decoding. It imports only the root package.
package httpjson

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/berth-dev/berth"
)

// StatusFor maps an error code to its HTTP status (API-2). Capacity refusals are 503, never
// 429 or 500; unknown codes are 500.
func StatusFor(code string) int {
	switch code {
	case berth.ENoCapacity, berth.ENoHealthyAgents, berth.EHostStartsSaturated, berth.EUnavailable, berth.EWakeTimeout:
		return http.StatusServiceUnavailable
	case berth.ETenantOverQuota, berth.EForbidden:
		return http.StatusForbidden
	case berth.ETemplateNotFound, berth.ESandboxNotFound, berth.ENotFound, berth.EAppNotFound:
		return http.StatusNotFound
	case berth.EInvalidRequest:
		return http.StatusBadRequest
	case berth.EUnauthorized:
		return http.StatusUnauthorized
	case berth.EConflict, berth.EServiceRunning, berth.EAppStopped:
		return http.StatusConflict
	case berth.EServiceExited, berth.EUpstream, berth.EAppError:
		return http.StatusBadGateway
	case berth.EUnsupported:
		return http.StatusNotImplemented
	case berth.ETooLarge:
		return http.StatusRequestEntityTooLarge
	case berth.EIdempotencyMismatch:
		return http.StatusUnprocessableEntity
	case berth.ERateLimited:
		return http.StatusTooManyRequests
	case berth.EMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case berth.EOutcomeUnknown:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// WriteJSON writes v as JSON with the given status. v is encoded before anything is sent: a
// value that cannot be encoded (a time outside years 0–9999, say) is a 500 internal error,
// never a status with an empty body (found by an attack: one agent's heartbeat time left
// GET /v1/agents answering 200 and nothing).
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		WriteError(w, "", fmt.Errorf("encode the answer: %w", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// WriteError writes err as an API-2 error body. Errors that are not *berth.Error, and every
// "internal" one, have the message "internal error" (details stay in the logs, issue 15); an
// *Error's Cause is never written. A retryable error with a RetryAfter also sets the
// Retry-After header in whole seconds (at least 1). An empty requestID falls back to the
// response's X-Request-Id header (set by a middleware, e.g. from the calling server's id), so
// an answer proxied on keeps its id.
func WriteError(w http.ResponseWriter, requestID string, err error) {
	var e *berth.Error
	if !errors.As(err, &e) || e.Code == berth.EInternal {
		e = &berth.Error{Code: berth.EInternal, Message: "internal error"}
	}
	if requestID == "" {
		requestID = w.Header().Get(berth.HeaderRequestID)
	}
	d := berth.ErrorDetail{
		Code:      e.Code,
		Message:   e.Message,
		Retryable: e.Retryable(),
		RequestID: requestID,
		Hosts:     e.Hosts,
	}
	if d.Retryable {
		d.RetryAfterS = max(int(math.Ceil(e.RetryAfter.Seconds())), 1)
		w.Header().Set("Retry-After", strconv.Itoa(d.RetryAfterS))
	}
	if requestID != "" {
		w.Header().Set(berth.HeaderRequestID, requestID)
	}
	WriteJSON(w, StatusFor(e.Code), berth.ErrorBody{Error: d})
}

// LogError logs err when its answer is a 5xx — error level for a 500 (its cause is only in
// this log, never in the body), warn for the others — with the request id the body carries,
// so an operator finds the cause from an answer's id (issue 15: every 5xx is logged). An
// empty requestID falls back to the response's X-Request-Id, as WriteError's does.
func LogError(log *slog.Logger, w http.ResponseWriter, r *http.Request, requestID string, err error) {
	status := StatusFor(berth.ErrorCode(err))
	if status < 500 {
		return
	}
	if requestID == "" {
		requestID = w.Header().Get(berth.HeaderRequestID)
	}
	level, msg := slog.LevelWarn, "request failed"
	if status == http.StatusInternalServerError {
		level, msg = slog.LevelError, "internal error"
	}
	route := r.Pattern
	if route == "" {
		route = r.URL.Path
	}
	log.Log(r.Context(), level, msg, "request_id", requestID, "method", r.Method,
		"route", route, "status", status, "code", berth.ErrorCode(err), "err", err)
}

// EchoRequestID makes the request id of a proxied call the id of its answer: a request's
// X-Request-Id (a printable token of at most 64 bytes, as the server sends to its agents) is
// set on the response before next runs, so WriteError's bodies carry it (issue 15: errors
// proxied from an agent keep their request id); a missing or malformed one gets a fresh id.
func EchoRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(berth.HeaderRequestID)
		if !validRequestID(id) {
			var b [8]byte
			_, _ = rand.Read(b[:])
			id = "req-" + hex.EncodeToString(b[:])
		}
		w.Header().Set(berth.HeaderRequestID, id)
		next.ServeHTTP(w, r)
	})
}

// validRequestID reports whether id is 1–64 bytes of ASCII letters, digits, '-' and '_'.
func validRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Decode reads one JSON value of at most limit bytes into v. Unknown fields, trailing data,
// oversized bodies and a string holding a NUL character (refuseNUL) are errors:
// invalid_request or request_too_large. The Content-Type is not checked: the body must be
// JSON whatever a client (e.g. plain `curl -d`) labels it.
func Decode(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if err := DecodeBinary(w, r, limit, v); err != nil {
		return err
	}
	return refuseNUL(reflect.ValueOf(v))
}

// DecodeBinary is Decode for a body whose strings may hold any character, NUL included: one
// never stored (exec's stdin). Errors as Decode's.
func DecodeBinary(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err, limit, v)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			// The object ended inside the limit but the body goes on past it (whitespace
			// padding, found by an attack): too large, as any body over the limit is.
			return berth.Errorf(berth.ETooLarge, "body larger than %d bytes", limit)
		}
		return berth.Errorf(berth.EInvalidRequest, "body must hold exactly one JSON object")
	}
	return nil
}

// ReadBody reads a raw body of at most limit bytes.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return nil, decodeError(err, limit, nil)
	}
	return b, nil
}

// decodeError turns a decoding error into an invalid_request or request_too_large *Error. v is
// the value decoded into (nil for a raw body): it turns a type error's Go field path into the
// JSON names a client sent.
func decodeError(err error, limit int64, v any) error {
	var mbe *http.MaxBytesError
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &mbe):
		return berth.Errorf(berth.ETooLarge, "body larger than %d bytes", limit)
	case errors.Is(err, io.EOF):
		return berth.Errorf(berth.EInvalidRequest, "empty body: a JSON object is required")
	case errors.As(err, &se):
		return berth.Errorf(berth.EInvalidRequest, "malformed JSON at byte %d", se.Offset)
	case errors.As(err, &te) && te.Field == "":
		return berth.Errorf(berth.EInvalidRequest, "body must be a JSON object, not %s", te.Value)
	case errors.As(err, &te):
		return typeError(te, v)
	}
	return berth.Errorf(berth.EInvalidRequest, "invalid body: %s", strings.TrimPrefix(err.Error(), "json: "))
}
