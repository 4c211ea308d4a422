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
// tenant/key creation are sent again only after a 429 rate_limited, which the server answers
// before doing anything (a tenant over its request rate, or an exec over a bound of exec
// requests in flight); any other answer or failure returns at once.
//
// A retried call retries on 502, 503 and 504 answers, on 429 answers whose code is
// rate_limited (issue 15), on connection failures (dial errors, connection resets, EOF before
// a response) and on attempts cut by their per-attempt deadline (below). Every other non-2xx
// answer returns at once.
//
// Before the next attempt the client sleeps:
//   - as the answer's Retry-After header says: delta-seconds, or an HTTP-date. Any run of
//     digits is seconds whatever its size ("86401", "20251231", twenty nines), saturating
//     instead of overflowing; a hint that ends past the deadline ends the call at once (see
//     Deadline, C30). The date is read against the answer's own Date header when present (so
//     a skewed client clock does not matter) and against the client's clock otherwise. A
//     date in the past means "retry at once" — but never twice in a row: a second immediate
//     hint in a row falls back to jitter, so a server whose clock lags cannot drive a hot
//     loop. A negative, signed, fractional or otherwise malformed value, and a date that does
//     not parse, are treated as absent: full jitter (C02);
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
// the waiting, not a single request: an attempt started before it runs to its own
// per-attempt deadline, so a call can end up to one attempt past it.
//
// # Per-attempt deadline (C28)
//
// Every attempt has a deadline of its own, from sending the request to the last byte of the
// answer (the body is read in full inside it), so a server that accepts the connection and
// never answers cannot hold a call forever. An ordinary call gets 60 s
// (DefaultAttemptTimeout; WithAttemptTimeout). A call whose own work is longer gets its own
// bound when that is longer: an exec its timeout_s (60 when absent) + 30 s; a file read or
// write and a pause 10 min + 30 s (the server's bound on moving a file or a checkpoint);
// a create and a resume 2 min (the server tries up to three hosts for 30 s each); an
// agent's evacuation plan its deadline_in_ms + 30 s. An attempt that runs out is a transport
// failure: an idempotent call retries it within the deadline above; any other call returns
// a *TransportError ("no answer from …: timed out"), which IsUnreachable reports. The
// context's deadline and an http.Client Timeout (WithHTTPClient) still apply when shorter.
//
// # Out of patience (SDK-2)
//
// *CapacityUnavailable is transient: callers should park the work as waiting for capacity,
// not fail it. errors.Is(err, ErrCapacityUnavailable) and IsCapacityUnavailable(err) report
// it; errors.As also finds the last *berth.Error inside it. It carries the elapsed time, the
// attempts, the last code and the server's last Retry-After.
//
// A request that got no answer at all and is not retried returns a *TransportError;
// IsUnreachable(err) reports that, or a *CapacityUnavailable whose last attempt got no
// answer. Every error this package makes starts with "berth: ".
//
// Cancelling the context stops any wait at once; the error then wraps ctx.Err().
package client
