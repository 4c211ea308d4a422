package client

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/netfail"
)

// ErrCapacityUnavailable is the sentinel that every *CapacityUnavailable matches with
// errors.Is (SDK-2).
var ErrCapacityUnavailable = errors.New("berth: capacity unavailable")

// CapacityUnavailable is returned when a retried call ran out of patience on retryable
// refusals (503 no_capacity and kin, 502/504, connection failures) (SDK-2): the next wait —
// the server's Retry-After, or full jitter — would have ended past the deadline. It is
// transient: park the work as waiting, not failed, and try again later.
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
	// RetryAfter is the wait the last answer's Retry-After header asked for; zero when it had
	// none, an unreadable one, or one that said "at once". A hint that ends past the deadline
	// is why a call gives up after a single attempt (C30).
	RetryAfter time.Duration
	// Err is the *TransportError of the last attempt when it got no answer (LastCode is then
	// "unavailable"); nil when the server answered.
	Err error
}

// Error implements error: what was unavailable, after how many attempts and how long, the
// last refusal and, when the server gave one, its Retry-After.
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
	attempts := fmt.Sprintf("%d attempts", e.Attempts)
	if e.Attempts == 1 {
		attempts = "1 attempt"
	}
	hint := ""
	if e.RetryAfter > 0 {
		hint = "; Retry-After " + e.RetryAfter.Round(time.Second).String()
	}
	return fmt.Sprintf("berth: %s after %s in %s (last: %s%s)",
		what, attempts, e.Elapsed.Round(time.Millisecond), last, hint)
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

// TransportError is a request that got no HTTP answer from the server: the connection was
// refused or reset, the name did not resolve, the dial or the request timed out, TLS failed,
// or the server hung up before answering. A call that is not retried (exec, drain, …), or a
// failure SDK-1 does not retry, returns it; errors.Is and errors.As reach the transport error
// underneath (syscall.ECONNREFUSED, *net.DNSError, …).
type TransportError struct {
	// Method and Path name the call ("POST", "/v1/sandboxes/sb-1/exec").
	Method, Path string
	// Server is the client's base URL.
	Server string
	// Err is the error net/http returned.
	Err error
}

// Error implements error: "berth: POST /v1/…: no answer from http://…: connection refused".
func (e *TransportError) Error() string {
	return fmt.Sprintf("berth: %s %s: no answer from %s: %s", e.Method, e.Path, e.Server, transportReason(e.Err))
}

// Unwrap returns the transport error.
func (e *TransportError) Unwrap() error { return e.Err }

// Reason is why there was no answer in a few words ("connection refused", "timed out",
// "cannot resolve host.example: no such host"), without net/http's framing.
func (e *TransportError) Reason() string { return transportReason(e.Err) }

// outcomeUnknown is the error of a call that does its work again when sent again (exec:
// request.runsTwice) when the request may have reached Berth but no answer of Berth's came back: the
// connection broke or timed out after it was sent, or a proxy answered 502/503/504 with a
// page of its own. It is a *berth.Error with code outcome_unknown, not retryable, its Cause
// the transport error or the proxy's answer: the call may have been done (an exec's command
// may have run), so it is the caller's to check before sending it again — never a
// "try again later" (found by an attack: `berth sandbox exec` exited 3, "retry", after the
// server had read the exec and hung up).
func outcomeUnknown(cause error, why string) *berth.Error {
	return berth.Wrap(berth.EOutcomeUnknown, cause, "%s, after the request was sent: it may have been done; check before sending it again", why)
}

// IsUnreachable reports whether err says the server could not be reached: a *TransportError
// from a connection failure (refused, reset, DNS, any dial error, a hang-up before the
// answer) or a timeout, or a *CapacityUnavailable whose last attempt was one. A TLS or URL
// error is not "unreachable": retrying later does not fix it.
func IsUnreachable(err error) bool {
	var be *berth.Error
	if errors.As(err, &be) && be.Code == berth.EOutcomeUnknown {
		return false // it was reached, or may have been: see outcomeUnknown
	}
	var te *TransportError
	if !errors.As(err, &te) {
		var cu *CapacityUnavailable
		if !errors.As(err, &cu) || cu.Err == nil || !errors.As(cu.Err, &te) {
			return false
		}
	}
	var ne net.Error
	return connectionFailure(te.Err) || (errors.As(te.Err, &ne) && ne.Timeout())
}

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
	return netfail.ClosedIdle(err)
}

// transportReason says in a few words why a request got no answer, for messages meant for
// people: the errno's text, "timed out", "cannot resolve NAME: …", or else the innermost
// error below net/http's `Get "URL": dial tcp ADDR: connect:` framing.
func transportReason(err error) string {
	if err == nil {
		return "no answer"
	}
	var dns *net.DNSError
	var ne net.Error
	var cut *attemptTimeoutError
	switch {
	case errors.As(err, &cut):
		return cut.Error() // "timed out after 1m0s": the per-attempt deadline (C28)
	case errors.As(err, &dns):
		return fmt.Sprintf("cannot resolve %s: %s", dns.Name, dns.Err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE):
		return "the connection was reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		netfail.ClosedIdle(err):
		return "the connection closed before an answer"
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	}
	for err != nil {
		var next error
		switch e := err.(type) {
		case *url.Error:
			next = e.Err
		case *net.OpError:
			next = e.Err
		case *os.SyscallError:
			next = e.Err
		default:
			return err.Error()
		}
		if next == nil {
			return err.Error()
		}
		err = next
	}
	return "no answer" // not reached: the loop returns
}
