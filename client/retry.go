package client

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth"
)

// maxRetryAfter is the longest Retry-After taken at its word; anything longer is absurd (no
// estimate of when capacity frees up is good for a day) and is treated as absent (C02).
const maxRetryAfter = 24 * time.Hour

// Backoff returns the full-jitter window min(cap, base·2^attempt) of SDK-1 (berth.Backoff,
// shared with the server's app reconciler): the caller sleeps uniform [0, window). attempt
// counts from 0 (the wait after the first failure). The window is always in (0, cap] and
// never overflows, for any attempt (64, 10,000, or negative, which counts as 0) (C04). A
// non-positive base or cap takes its default (0.25 s, 8 s); a base above the cap is lowered
// to the cap.
func Backoff(attempt int, base, cap time.Duration) time.Duration {
	return berth.Backoff(attempt, base, cap)
}

// jitter returns a full-jitter sleep: r·window with r from the uniform [0,1) source, which
// is clamped into [0,1) so a faulty source can never stretch the sleep past the window.
func jitter(window time.Duration, r float64) time.Duration {
	switch {
	case !(r > 0): // also NaN
		return 0
	case r >= 1:
		return window - 1
	}
	d := time.Duration(r * float64(window))
	if d >= window { // r just below 1 can round up
		d = window - 1
	}
	return d
}

// ParseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3) against now: delta-seconds (a
// non-negative integer) or an HTTP-date (any form http.ParseTime accepts). A date at or
// before now gives 0, true: retry at once (C01). A negative, fractional, malformed or
// absurd value (over 24 h) gives 0, false: treat as absent (C02).
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		// Compare digit counts before converting so a 30-digit value cannot overflow.
		v = strings.TrimLeft(v, "0")
		if len(v) > 6 { // > 999,999 s, well over the 24 h bound
			return 0, false
		}
		secs := 0
		for _, ch := range v {
			secs = secs*10 + int(ch-'0')
		}
		d := time.Duration(secs) * time.Second
		if d > maxRetryAfter {
			return 0, false
		}
		return d, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now) // saturates rather than overflows for far dates
	if d <= 0 {
		return 0, true
	}
	if d > maxRetryAfter {
		return 0, false
	}
	return d, true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// retryAfterHeader reads the Retry-After header of an answer. An HTTP-date is read against
// the answer's own Date header when it has a valid one, so the wait is the server's
// "date minus now" whatever the skew between the two clocks; otherwise against local.
func retryAfterHeader(h http.Header, local time.Time) (time.Duration, bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	now := local
	if d, err := http.ParseTime(h.Get("Date")); err == nil {
		now = d
	}
	return ParseRetryAfter(v, now)
}

// ErrCapacityUnavailable is the sentinel that every *CapacityUnavailable matches with
// errors.Is (SDK-2).
var ErrCapacityUnavailable = errors.New("berth: capacity unavailable")

// CapacityUnavailable is returned when a retried call ran out of patience on retryable
// refusals (503 no_capacity and kin, 502/504, connection failures) (SDK-2). It is transient:
// park the work as waiting, not failed, and try again later.
type CapacityUnavailable struct {
	// Elapsed is the time from the first attempt to giving up.
	Elapsed time.Duration
	// Attempts is the number of requests sent.
	Attempts int
	// LastCode is the code of the last refusal; "unavailable" when the last failure was a
	// connection error.
	LastCode string
	// Last is the last refusal itself.
	Last *berth.Error
}

// Error implements error.
func (e *CapacityUnavailable) Error() string {
	last := e.LastCode
	if e.Last != nil {
		last = e.Last.Error()
	}
	what := "capacity unavailable"
	if e.LastCode == berth.EUnavailable {
		// A server that cannot be reached is not a full fleet: say which it was.
		what = "server unavailable"
	}
	return fmt.Sprintf("berth: %s after %d attempts in %s (last: %s)",
		what, e.Attempts, e.Elapsed.Round(time.Millisecond), last)
}

// Unwrap returns the last refusal, so errors.As finds the *berth.Error too.
func (e *CapacityUnavailable) Unwrap() error {
	if e.Last == nil {
		return nil
	}
	return e.Last
}

// Is makes errors.Is(err, ErrCapacityUnavailable) true.
func (e *CapacityUnavailable) Is(target error) bool { return target == ErrCapacityUnavailable }

// IsCapacityUnavailable reports whether err is, or wraps, a *CapacityUnavailable (SDK-2).
func IsCapacityUnavailable(err error) bool { return errors.Is(err, ErrCapacityUnavailable) }

// connectionFailure reports whether a transport error means the request never got an
// answer, which SDK-1 retries for idempotent calls: dial errors (refused, unreachable, DNS),
// resets and aborts, and EOF before a response. Timeouts and TLS errors are not in the list.
func connectionFailure(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	// net/http reports a server that closed the connection before answering (EOF before a
	// response) with an unexported error that does not wrap io.EOF.
	return strings.Contains(err.Error(), "server closed idle connection")
}
