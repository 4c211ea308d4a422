package berth

import "time"

// Full-jitter backoff defaults (SDK-1): base 0.25 s, cap 8 s.
const (
	BackoffBase = 250 * time.Millisecond
	BackoffCap  = 8 * time.Second
)

// Backoff returns the full-jitter window min(cap, base·2^attempt) of SDK-1, used by the SDK,
// the server's app reconciler (APP-2) and the simulator: the caller sleeps uniform
// [0, window). attempt counts from 0 (the wait after the first failure). The window is always
// in (0, cap] and never overflows, for any attempt (64, 10,000, or negative, which counts as
// 0) (C04). A non-positive base or cap takes its default (0.25 s, 8 s); a base above the cap
// is lowered to the cap.
func Backoff(attempt int, base, cap time.Duration) time.Duration {
	if cap <= 0 {
		cap = BackoffCap
	}
	if base <= 0 {
		base = BackoffBase
	}
	if base > cap {
		base = cap
	}
	if attempt < 0 {
		attempt = 0
	}
	// base·2^attempt ≤ cap ⇔ base ≤ cap>>attempt (up to rounding, which only ever picks cap
	// a little early); checking it this way never computes an overflowing product.
	if attempt >= 63 || base > cap>>attempt {
		return cap
	}
	return base << attempt
}
