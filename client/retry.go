package client

import (
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/berth-dev/berth"
)

// maxRetryAfter is where a Retry-After saturates: the longest time.Duration (about 292
// years). Any all-digit value converts to at most this, without overflow, and so ends past
// every deadline a caller can set (C30).
const maxRetryAfter = time.Duration(math.MaxInt64)

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

// ParseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3) against now (SDK-1):
//
//   - delta-seconds, one or more ASCII digits: that many seconds whatever its size. "86401",
//     "20251231" and twenty nines are long waits, not garbage; a value past what a
//     time.Duration holds saturates at about 292 years instead of overflowing. The retry
//     loop gives up at once when the wait ends past its deadline (C30).
//   - an HTTP-date (any form http.ParseTime accepts): the time until that instant, saturating
//     the same way. A date at or before now gives 0, true: retry at once (C01) — the loop
//     never does that twice in a row; the second time it falls back to full jitter.
//   - anything else — negative, signed, fractional, empty, garbage, or a date that does not
//     parse — gives 0, false: the hint is treated as absent and the loop uses full jitter (C02).
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		return parseSeconds(v), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now) // saturates at maxRetryAfter rather than overflowing for far dates
	if d <= 0 {
		return 0, true
	}
	return d, true
}

// parseSeconds converts a string of ASCII digits to that many seconds, saturating at
// maxRetryAfter: digits are counted and each step checked before it can overflow.
func parseSeconds(digits string) time.Duration {
	const maxSecs = int64(maxRetryAfter / time.Second)
	var secs int64
	for _, ch := range digits {
		secs = secs*10 + int64(ch-'0') // secs ≤ maxSecs (10 digits) here: cannot overflow
		if secs > maxSecs {
			return maxRetryAfter
		}
	}
	return time.Duration(secs) * time.Second
}

// seconds converts a count of whole seconds from a body (retry_after_s) the same way.
func seconds(n int64) time.Duration {
	switch {
	case n <= 0:
		return 0
	case n > int64(maxRetryAfter/time.Second):
		return maxRetryAfter
	}
	return time.Duration(n) * time.Second
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
