package berth

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
)

// FaultRetryAfter is the Retry-After of a transient fault (Fault): long enough for a pool to
// reconnect or a lock to clear, short enough that a client does not wait on a healthy store.
const FaultRetryAfter = time.Second

// Fault returns the *Error for an unexpected failure of a dependency (the store, the
// network) while doing what format names, with cause as its Cause (issue 15, API-2):
//
//   - cause already carries an *Error (a refusal with its own code): that code, message and
//     RetryAfter, with the step's text in front;
//   - Transient(cause): unavailable, retryable, RetryAfter FaultRetryAfter, the message the
//     step's text (the cause stays in the logs);
//   - anything else (a closed database, a bad query, a scan error: a bug or a broken
//     deployment that retrying cannot fix): internal, not retryable; its body says only
//     "internal error".
//
// A nil cause gives internal too: a Fault is never a success.
func Fault(cause error, format string, args ...any) *Error {
	var be *Error
	if errors.As(cause, &be) {
		e := Wrap(be.Code, cause, format, args...)
		e.Message += ": " + be.Message
		e.RetryAfter, e.Hosts = be.RetryAfter, be.Hosts
		return e
	}
	if Transient(cause) {
		e := Wrap(EUnavailable, cause, format, args...)
		e.RetryAfter = FaultRetryAfter
		return e
	}
	return Wrap(EInternal, cause, format, args...)
}

// Transient reports whether err is a failure that a retry of the same call may not meet
// again (issue 15): the network (connection refused, reset or aborted, a host or network
// unreachable, a broken pipe, any timeout, a connection cut mid-answer), a context deadline
// or cancellation (the caller left, or the server is shutting down: not a bug),
// a PostgreSQL error that pgx marks safe to retry (pgconn.SafeToRetry: nothing was sent) or
// whose SQLSTATE is a serialization failure (40001), a deadlock (40P01), a connection
// exception (class 08), an admin or crash shutdown or a server still starting (57P01, 57P02,
// 57P03), too many connections (53300) or a lock not available (55P03), and SQLite's busy or
// locked (result codes 5 and 6, extended codes included). Everything else, a closed
// database ("sql: database is closed", pgx's "closed pool") included, is not: it is a bug or
// a broken deployment.
//
// The root package imports no driver, so drivers are recognised by the methods their errors
// have: SafeToRetry() bool (pgconn), SQLState() string (pgconn.PgError), Code() int
// (modernc.org/sqlite's *Error).
func Transient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED,
		syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ENETDOWN, syscall.EPIPE, syscall.ETIMEDOUT} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var safe interface{ SafeToRetry() bool }
	if errors.As(err, &safe) && safe.SafeToRetry() {
		return true
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		switch st := pg.SQLState(); {
		case st == "40001", st == "40P01", strings.HasPrefix(st, "08"),
			st == "57P01", st == "57P02", st == "57P03", st == "53300", st == "55P03":
			return true
		}
	}
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		switch lite.Code() & 0xff {
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return true
		}
	}
	return false
}
