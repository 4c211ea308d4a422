// Package client is the public Go SDK of the Berth v1 HTTP API (SPEC §13).
//
// A Client is safe for concurrent use. Every call returns either its result or an error; API
// refusals are *berth.Error values carrying the stable code of API-2 (branch on Code, never on
// Message), and a call that ran out of patience on retryable refusals returns a
// *CapacityUnavailable.
//
// # Retry policy (SDK-1)
//
// Only idempotent calls are retried: GET, DELETE, file PUT and sandbox create (which always
// carries an Idempotency-Key, API-4, generated once per call and reused on every attempt, and
// the first attempt's time in Berth-First-Attempt, SDK-3). Exec, heartbeats, drain/undrain and
// tenant/key creation are sent exactly once.
//
// A retried call retries on 502, 503 and 504 answers and on connection failures (dial errors,
// connection resets, EOF before a response). Every other non-2xx answer returns at once.
//
// Before the next attempt the client sleeps:
//   - as the answer's Retry-After header says: delta-seconds, or an HTTP-date. The date is read
//     against the answer's own Date header when present (so a skewed client clock does not
//     matter) and against the client's clock otherwise. A date in the past means "retry at
//     once" — but never twice in a row: a second immediate hint in a row falls back to
//     jitter, so a server whose clock lags cannot drive a hot loop. A negative, malformed or
//     absurd (over 24 h) value is treated as absent (C02);
//   - otherwise with full jitter: uniform [0, Backoff(attempt, base, cap)), base 0.25 s and
//     cap 8 s by default, attempt counting from 0 for the first failure (C04, C05).
//
// # Deadline
//
// Retrying stops at an overall deadline, 90 s after the first attempt by default
// (WithDeadline), or the context's deadline when that is earlier. A sleep never overshoots
// it: when the next wait would end past the deadline the client does not sleep at all — it
// stops at once and returns *CapacityUnavailable rather than sleep up to the deadline and
// burn one last attempt that the server has already said is too early. The deadline bounds
// the waiting, not a single request: how long one request may take is up to the context and
// the http.Client (an exec may legitimately run for minutes).
//
// # Out of patience (SDK-2)
//
// *CapacityUnavailable is transient: callers should park the work as waiting for capacity,
// not fail it. errors.Is(err, ErrCapacityUnavailable) and IsCapacityUnavailable(err) report
// it; errors.As also finds the last *berth.Error inside it.
//
// Cancelling the context stops any wait at once; the error then wraps ctx.Err().
package client
