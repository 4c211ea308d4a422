"""Berth's exceptions: one hierarchy mirroring the error envelope of every non-2xx answer
(API-2), ``{"error": {"code", "message", "retryable", "retry_after_s", "request_id",
"hosts"?}}``.

Branch on the class or on ``code`` (stable strings, docs/API.md "Errors"), never on
``message``::

    BerthError                       every error this package raises
    ├── InvalidRequest               invalid_request, request_too_large, idempotency_key_mismatch
    ├── Unauthorized                 unauthorized
    ├── Forbidden                    forbidden, tenant_over_quota
    ├── NotFound                     not_found, sandbox_not_found, app_not_found, template_not_found
    ├── Conflict                     conflict, app_stopped, service_running
    ├── RetryableError               no_capacity, no_healthy_agents, host_starts_saturated,
    │                                unavailable, rate_limited, app_wake_timeout (a call that is
    │                                not retried, such as exec, raises it as it came)
    ├── InternalError                internal
    ├── TransportError               no HTTP answer at all (connection refused, timed out, TLS)
    └── CapacityUnavailable          a retried call ran out of patience (SDK-2): park the work
                                     as waiting, not failed

``outcome_unknown`` (an exec whose command may have run: the server's 504, the exec reached
its sandbox's host but no whole answer came back; or no answer of Berth's after the request
was sent, a TransportError with that code; or a 2xx whose body is not an exec result) raises
BerthError itself: it is not retryable, and running the command again is the caller's
decision. Any other code (one added after this SDK) raises BerthError itself with that code.
"""

from __future__ import annotations

from typing import Dict, Optional

# Stable error codes (API-2), as in the Go package berth (error.go).
NO_CAPACITY = "no_capacity"
NO_HEALTHY_AGENTS = "no_healthy_agents"
HOST_STARTS_SATURATED = "host_starts_saturated"
TENANT_OVER_QUOTA = "tenant_over_quota"
TEMPLATE_NOT_FOUND = "template_not_found"
SANDBOX_NOT_FOUND = "sandbox_not_found"
NOT_FOUND = "not_found"
INVALID_REQUEST = "invalid_request"
UNAUTHORIZED = "unauthorized"
FORBIDDEN = "forbidden"
CONFLICT = "conflict"
REQUEST_TOO_LARGE = "request_too_large"
UNAVAILABLE = "unavailable"
INTERNAL = "internal"
SERVICE_RUNNING = "service_running"
SERVICE_EXITED = "service_exited"
APP_UNREACHABLE = "app_unreachable"
UNSUPPORTED = "unsupported"
APP_NOT_FOUND = "app_not_found"
APP_STOPPED = "app_stopped"
APP_ERROR = "app_error"
APP_WAKE_TIMEOUT = "app_wake_timeout"
IDEMPOTENCY_KEY_MISMATCH = "idempotency_key_mismatch"
RATE_LIMITED = "rate_limited"
METHOD_NOT_ALLOWED = "method_not_allowed"
OUTCOME_UNKNOWN = "outcome_unknown"

#: The codes a later try may fix (berth.Error.Retryable in Go).
RETRYABLE_CODES = frozenset({
    NO_CAPACITY, NO_HEALTHY_AGENTS, HOST_STARTS_SATURATED, UNAVAILABLE, APP_WAKE_TIMEOUT, RATE_LIMITED,
})


class BerthError(Exception):
    """An error of the Berth API, or of reaching it. Every field of the error envelope is an
    attribute:

    - ``code``: the stable code (API-2), e.g. ``"sandbox_not_found"``;
    - ``message``: for people; never branch on it;
    - ``retryable``: whether a later try may succeed;
    - ``retry_after_s``: the server's estimate, in seconds, of when a retry may succeed (the
      body's ``retry_after_s``, else its ``Retry-After`` header); 0 when none;
    - ``request_id``: the server's id of the request, also in its log ("" when none);
    - ``hosts``: hosts per rejection reason of a capacity refusal (``{"total": 12, …}``), or {};
    - ``status``: the HTTP status, or None when there was no answer.
    """

    def __init__(self, code: str, message: str = "", *, retryable: Optional[bool] = None,
                 retry_after_s: float = 0.0, request_id: str = "",
                 hosts: Optional[Dict[str, int]] = None, status: Optional[int] = None) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.retryable = (code in RETRYABLE_CODES) if retryable is None else bool(retryable)
        self.retry_after_s = retry_after_s
        self.request_id = request_id
        self.hosts: Dict[str, int] = dict(hosts or {})
        self.status = status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
                f"status={self.status!r}, request_id={self.request_id!r})")


class InvalidRequest(BerthError):
    """400 invalid_request (or 413 request_too_large, 422 idempotency_key_mismatch): fix the
    request; retrying it unchanged fails the same way."""


class Unauthorized(BerthError):
    """401 unauthorized: a missing, unknown or revoked key."""


class Forbidden(BerthError):
    """403 forbidden (the key lacks the role, or the sandbox's own file permissions refuse a
    file call) or tenant_over_quota (the quota is used up)."""


class NotFound(BerthError):
    """404: no such sandbox, app, template or other entity visible to the key. Another
    tenant's sandbox is not found, not forbidden."""


class Conflict(BerthError):
    """409: the state does not allow the call (exec on a stopped sandbox, an app name taken,
    a stopped app, …)."""


class RetryableError(BerthError):
    """A retryable refusal (no_capacity, unavailable, rate_limited, …) raised as it came: by a
    call that is never retried (exec, tenant and key creation). Retried calls raise
    CapacityUnavailable instead once their deadline would pass."""


class InternalError(BerthError):
    """500 internal: a bug or a broken deployment; the server's log has the cause on the line
    with the same request_id."""


class TransportError(BerthError):
    """The request got no HTTP answer: connection refused or reset, a name that does not
    resolve, a timeout, TLS failure, or a hang-up before the answer. A call that is not
    retried (exec, …), or a failure SDK-1 does not retry (TLS), raises it; the underlying
    exception is ``__cause__``. ``code`` is ``"unavailable"``; ``unreachable`` (and
    ``retryable``) is True when trying later may help (a connection failure or a timeout),
    False for TLS and URL errors. An exec that may have reached the server (the connection
    broke or timed out after it was sent) has code ``"outcome_unknown"`` and is neither: its
    command may have run.
    """

    def __init__(self, method: str, path: str, server: str, reason: str, *, unreachable: bool,
                 code: str = UNAVAILABLE) -> None:
        super().__init__(code, f"{method} {path}: no answer from {server}: {reason}",
                         retryable=unreachable)
        self.method = method
        self.path = path
        self.server = server
        self.reason = reason
        self.unreachable = unreachable

    def __str__(self) -> str:
        return "berth: " + self.message


def _fmt_seconds(s: float) -> str:
    return f"{round(s, 3):g}s"


class CapacityUnavailable(BerthError):
    """A retried call ran out of patience on retryable refusals (503 no_capacity and kin,
    502/504, 429 rate_limited, connection failures) (SDK-2): the next wait — the server's
    Retry-After, or full jitter — would have ended past the deadline. It is transient: park the
    work as waiting, not failed, and try again later.

    ``code`` is the last refusal's code (``last_code``; ``"unavailable"`` when the last attempt
    got no answer); ``retry_after_s`` the wait the last answer's Retry-After header asked for
    (0 when it had none or said "at once" — a hint past the deadline is why a call gives up
    after one attempt, C30); ``last`` the last refusal itself (also ``__cause__``);
    ``attempts`` the requests sent; ``elapsed_s`` the seconds from the first attempt to giving
    up; ``transport_error`` the TransportError of the last attempt when it got no answer.
    """

    def __init__(self, *, last: BerthError, attempts: int, elapsed_s: float, retry_after_s: float,
                 transport_error: Optional[TransportError] = None) -> None:
        super().__init__(last.code, last.message, retryable=True, retry_after_s=retry_after_s,
                         request_id=last.request_id, hosts=last.hosts, status=last.status)
        self.last = last
        self.last_code = last.code
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.transport_error = transport_error

    def __str__(self) -> str:
        # A server that cannot be reached is not a full fleet: say which it was.
        what = "server unavailable" if self.last_code == UNAVAILABLE else "capacity unavailable"
        attempts = "1 attempt" if self.attempts == 1 else f"{self.attempts} attempts"
        hint = f"; Retry-After {round(self.retry_after_s):d}s" if self.retry_after_s > 0 else ""
        return f"berth: {what} after {attempts} in {_fmt_seconds(self.elapsed_s)} (last: {self.last}{hint})"


_BY_CODE = {
    INVALID_REQUEST: InvalidRequest, REQUEST_TOO_LARGE: InvalidRequest, IDEMPOTENCY_KEY_MISMATCH: InvalidRequest,
    UNAUTHORIZED: Unauthorized,
    FORBIDDEN: Forbidden, TENANT_OVER_QUOTA: Forbidden,
    NOT_FOUND: NotFound, SANDBOX_NOT_FOUND: NotFound, APP_NOT_FOUND: NotFound, TEMPLATE_NOT_FOUND: NotFound,
    CONFLICT: Conflict, APP_STOPPED: Conflict, SERVICE_RUNNING: Conflict,
    NO_CAPACITY: RetryableError, NO_HEALTHY_AGENTS: RetryableError, HOST_STARTS_SATURATED: RetryableError,
    UNAVAILABLE: RetryableError, RATE_LIMITED: RetryableError, APP_WAKE_TIMEOUT: RetryableError,
    INTERNAL: InternalError,
}


def error_for(code: str, message: str, **kw: object) -> BerthError:
    """Return the exception of the class for ``code`` (BerthError itself for a code this SDK
    does not know)."""
    cls = _BY_CODE.get(code, BerthError)
    return cls(code, message, **kw)  # type: ignore[arg-type]
