"""The Berth client: one HTTP call per method, retried by the policy of SDK-1.

Retry policy (SDK-1), the Go SDK's (client/doc.go) to the letter:

- Only idempotent calls are retried: GETs, DELETEs, file writes, pause and resume, the app
  desired-state actions, and the creates of sandboxes and apps and app deploys (which always
  carry an ``Idempotency-Key``, made once per call and sent on every attempt with the first
  attempt's time in ``Berth-First-Attempt`` and its number in ``Berth-Attempt``: API-4,
  SDK-3). Exec and tenant/key creation are sent again only after a 429 ``rate_limited``,
  which the server answers before doing anything (a tenant over its request rate, or an exec
  over a bound of exec requests in flight); any other answer or failure raises at once.
- A retried call retries 502, 503 and 504 answers, 429 answers whose code is
  ``rate_limited``, connection failures (refused, reset, a name that does not resolve, a
  hang-up before the answer) and timeouts. Every other non-2xx answer raises at once.
- Before the next attempt it sleeps as the answer's ``Retry-After`` says (delta-seconds of any
  size, or an HTTP-date read against the answer's own ``Date``; a date already gone means
  "at once", but never twice in a row), otherwise full jitter: uniform
  [0, min(cap, base·2^attempt)), base 0.25 s, cap 8 s. A malformed hint counts as absent.
- Retrying stops at a deadline, 90 s after the first attempt by default: when the next wait
  would end past it the client does not sleep at all and raises CapacityUnavailable (SDK-2) —
  park the work as waiting, not failed.

Per-attempt bound (C28): every attempt passes a timeout to the socket — 60 s for an ordinary
call, an exec's own ``timeout_s`` (60 when absent) + 30 s, 10.5 min for a file transfer and a
pause, 2 min for a create and a resume. It bounds each blocking socket operation (connect, each
read), which is what urllib offers; the Go SDK bounds the whole answer.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
import ssl
import time
import http
import http.client
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from . import _retry
from .errors import (
    INTERNAL, INVALID_REQUEST, OUTCOME_UNKNOWN, RATE_LIMITED, UNAVAILABLE, BerthError, CapacityUnavailable,
    InvalidRequest, TransportError, error_for,
)
from .models import APIKeySecret, App, AppSpec, Event, ExecResult, Retry, Sandbox, Template, Tenant

__all__ = ["Client", "DEFAULT_URL", "DEFAULT_DEADLINE_S", "DEFAULT_USER_AGENT"]

#: The server `berth dev` listens on by default.
DEFAULT_URL = "http://127.0.0.1:7070"
#: Defaults of the retry policy (SDK-1), seconds.
DEFAULT_DEADLINE_S = 90.0
DEFAULT_BACKOFF_BASE_S = 0.25
DEFAULT_BACKOFF_CAP_S = 8.0
#: One attempt of an ordinary call (C28), seconds.
DEFAULT_ATTEMPT_TIMEOUT_S = 60.0
DEFAULT_USER_AGENT = "berth-python/1"

# Per-attempt bounds of the calls whose own work is longer (C28; client/do.go).
_ATTEMPT_MARGIN_S = 30.0
_DEFAULT_EXEC_S, _MAX_EXEC_S = 60, 3600
_TRANSFER_ATTEMPT_S = 600.0 + _ATTEMPT_MARGIN_S
_PLACEMENT_ATTEMPT_S = 3 * 30.0 + _ATTEMPT_MARGIN_S

#: How much of a non-2xx body is read (a proxy's page can be large).
_MAX_ERROR_BODY = 1 << 20
#: What Go's TLS server answers (400) to a request sent in clear.
_PLAINTEXT_TO_TLS = b"Client sent an HTTP request to an HTTPS server"

_HTTP_REASONS = {s.value: s.phrase for s in http.HTTPStatus}


@dataclass
class _Request:
    """One API call as the retry loop sees it; body is bytes so every attempt resends it."""

    method: str
    path: str  # escaped, starting with /v1
    query: Optional[Dict[str, str]] = None
    body: Optional[bytes] = None
    content_type: str = ""
    idempotent: bool = False
    idempotency_key: str = ""
    own_timeout_s: float = 0.0  # the call's own per-attempt bound, when longer (C28)
    # Sent twice, it does its work twice (exec: the command runs again). When it may have
    # reached Berth and no answer of Berth's came back, it raises outcome_unknown, never a
    # retryable error.
    runs_twice: bool = False


@dataclass
class _Response:
    status: int
    headers: Any  # http.client.HTTPMessage
    body: bytes


class _Clock:
    """The client's time: ``wall`` (seconds since the epoch) for HTTP-dates and the
    first-attempt stamp, ``mono`` for the deadline, ``sleep`` between attempts. An injected
    ``now`` serves as both."""

    def __init__(self, now: Optional[Callable[[], float]], sleep: Optional[Callable[[float], None]]) -> None:
        self.wall: Callable[[], float] = now or time.time
        self.mono: Callable[[], float] = now or time.monotonic
        self.sleep: Callable[[float], None] = sleep or time.sleep


def _positive(v: Optional[float], default: float) -> float:
    return float(v) if v is not None and v > 0 else default


class Client:
    """A client of one Berth server.

    ``url`` defaults to ``$BERTH_URL``, else ``http://127.0.0.1:7070`` (``berth dev``); ``key``
    to ``$BERTH_KEY`` — a tenant or admin API key, sent as ``Authorization: Bearer <key>``.

    Retry options (SDK-1; a non-positive value keeps the default): ``deadline_s`` (90),
    ``backoff_base_s`` (0.25), ``backoff_cap_s`` (8; a base above the cap is lowered to it),
    ``attempt_timeout_s`` (60, one attempt of an ordinary call). For tests: ``clock`` (a
    function returning seconds since the epoch; default time.time for dates and
    time.monotonic for the deadline), ``sleep`` (default time.sleep), ``rand`` (uniform [0, 1),
    default random.random). ``on_retry`` is called with a :class:`berth.models.Retry` before
    every wait, so a caller can say what is happening. ``ca_file`` makes an https:// client
    trust only the CA certificates in that PEM file (a private CA); with an http:// URL it is
    refused (InvalidRequest), so a key never crosses in clear under a trust the caller did not
    ask for. It defaults to ``$BERTH_CA`` for an https:// URL (as the CLI's ``--ca``).

    The calls are grouped: ``client.sandboxes``, ``client.apps``, ``client.events``,
    ``client.templates``, ``client.tenants``. A client may be shared between threads when
    the injected clock, sleep and rand may be.
    """

    def __init__(self, url: Optional[str] = None, key: Optional[str] = None, *,
                 deadline_s: Optional[float] = None, backoff_base_s: Optional[float] = None,
                 backoff_cap_s: Optional[float] = None, attempt_timeout_s: Optional[float] = None,
                 clock: Optional[Callable[[], float]] = None, sleep: Optional[Callable[[float], None]] = None,
                 rand: Optional[Callable[[], float]] = None, user_agent: str = DEFAULT_USER_AGENT,
                 on_retry: Optional[Callable[[Retry], None]] = None, ca_file: Optional[str] = None) -> None:
        url = url or os.environ.get("BERTH_URL") or DEFAULT_URL
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname or u.username is not None:
            hint = f" (did you mean http://{url} ?)" if "://" not in url else ""
            raise InvalidRequest(INVALID_REQUEST, f"{url!r} is not a server URL: want http://HOST:PORT or https://HOST:PORT{hint}")
        self.url = url.rstrip("/")
        self._key = key if key is not None else os.environ.get("BERTH_KEY", "")
        self.deadline_s = _positive(deadline_s, DEFAULT_DEADLINE_S)
        self.attempt_timeout_s = _positive(attempt_timeout_s, DEFAULT_ATTEMPT_TIMEOUT_S)
        self._base_ns = int(_positive(backoff_base_s, DEFAULT_BACKOFF_BASE_S) * _retry.NS)
        self._cap_ns = int(_positive(backoff_cap_s, DEFAULT_BACKOFF_CAP_S) * _retry.NS)
        self._clock = _Clock(clock, sleep)
        self._rand = rand or random.random
        self.user_agent = user_agent
        self.on_retry = on_retry
        handlers: List[Any] = []
        if ca_file is None and u.scheme == "https":
            ca_file = os.environ.get("BERTH_CA") or None  # as the CLI: BERTH_CA does not apply to http://
        if ca_file is not None:
            if u.scheme != "https":
                raise InvalidRequest(INVALID_REQUEST, f"client CA {ca_file} given for {url}: a CA is for an https:// server; over anything else the key would cross in clear")
            try:
                ctx = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as e:
                raise InvalidRequest(INVALID_REQUEST, f"client CA {ca_file}: {e}") from e
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        self._opener = urllib.request.build_opener(*handlers)

        self.sandboxes = Sandboxes(self)
        self.apps = Apps(self)
        self.events = Events(self)
        self.templates = Templates(self)
        self.tenants = Tenants(self)

    def __repr__(self) -> str:
        return f"Client(url={self.url!r})"  # never the key

    # -- the retry loop (SDK-1) --------------------------------------------------------------

    def _do(self, r: _Request) -> _Response:
        """Send r, retrying it by SDK-1 when it is idempotent. Returns the 2xx answer; raises
        the BerthError of any other answer it does not retry, CapacityUnavailable when the
        next wait would end past the deadline (at once, without sleeping, when a Retry-After
        of any size does: C30), TransportError for a request that got no answer and is not
        retried."""
        clk = self._clock
        start_wall = clk.wall()
        start = clk.mono()
        deadline = start + self.deadline_s
        last: Optional[BerthError] = None
        prev_immediate = False
        attempt = 0
        while True:
            hint_ns, has_hint = 0, False
            no_answer: Optional[TransportError] = None
            try:
                resp = self._once(r, start_wall, attempt + 1)
            except _NoAnswer as na:
                if r.runs_twice and not _not_sent(na.err):
                    raise TransportError(r.method, r.path, self.url,
                                         _reason(na.err) + ", after the request was sent: it may have been done;"
                                         " check before sending it again",
                                         unreachable=False, code=OUTCOME_UNKNOWN) from na.err
                no_answer = TransportError(r.method, r.path, self.url, _reason(na.err),
                                           unreachable=_retried_failure(na.err))
                if not r.idempotent or not no_answer.unreachable:
                    raise no_answer from na.err
                last = BerthError(UNAVAILABLE, f"no answer from {self.url}: {no_answer.reason}", retryable=True)
            else:
                if 200 <= resp.status < 300:
                    return resp
                now = clk.wall()
                e = _decode_error(resp.status, resp.headers, resp.body, now)
                # A 429 is retried only as rate_limited (a tenant over its request rate, or an
                # exec over a bound of execs in flight), for any call: the server refused it
                # before doing anything.
                rate_limited = resp.status == 429 and e.code == RATE_LIMITED
                if r.runs_twice and _retryable_status(resp.status) and _error_detail(resp.body) is None:
                    # A proxy's 502/503/504 page: whether Berth got the call is unknown.
                    raise BerthError(OUTCOME_UNKNOWN, e.message + ", after the request was sent: it may have been done;"
                                     " check before sending it again", retryable=False, status=resp.status) from e
                if not rate_limited and not (r.idempotent and _retryable_status(resp.status)):
                    raise e
                last = e
                hint_ns, has_hint = _retry.retry_after_header(resp.headers, now)

            # Honour the server's hint, except a second "at once" in a row.
            immediate = has_hint and hint_ns == 0
            from_hint = has_hint and not (immediate and prev_immediate)
            if from_hint:
                wait_ns = hint_ns
            else:
                wait_ns = _retry.jitter_ns(_retry.backoff_ns(attempt, self._base_ns, self._cap_ns), self._rand())
                immediate = False
            prev_immediate = immediate

            # Never sleep past the deadline: if the wait would end beyond it, stop now.
            now_m = clk.mono()
            wait_s = wait_ns / _retry.NS
            if wait_s > deadline - now_m:
                raise CapacityUnavailable(last=last, attempts=attempt + 1, elapsed_s=now_m - start,
                                          retry_after_s=hint_ns / _retry.NS, transport_error=no_answer) from last
            if self.on_retry is not None:
                self.on_retry(Retry(attempt=attempt + 1, wait_s=wait_s, from_retry_after=from_hint,
                                    last=last, transport_error=no_answer))
            clk.sleep(wait_s)
            attempt += 1

    def _once(self, r: _Request, first_wall: float, attempt: int) -> _Response:
        """Send one attempt of r and read its answer in full; raises _NoAnswer when there was
        none."""
        url = self.url + r.path
        if r.query:
            url += "?" + urllib.parse.urlencode(r.query)
        req = urllib.request.Request(url, data=r.body, method=r.method)
        if self._key:
            req.add_header("Authorization", "Bearer " + self._key)
        if self.user_agent:
            req.add_header("User-Agent", self.user_agent)
        req.add_header("Accept", "application/json")
        if r.content_type:
            req.add_header("Content-Type", r.content_type)
        if r.idempotency_key:
            req.add_header("Idempotency-Key", r.idempotency_key)
            req.add_header("Berth-First-Attempt", _rfc3339(first_wall))
            req.add_header("Berth-Attempt", str(attempt))
        timeout = max(self.attempt_timeout_s, r.own_timeout_s)
        try:
            try:
                res = self._opener.open(req, timeout=timeout)
            except urllib.error.HTTPError as he:  # a non-2xx answer: read (a bounded part of) it
                try:
                    body = he.read(_MAX_ERROR_BODY) if he.fp is not None else b""
                finally:
                    he.close()
                return _Response(he.code, he.headers, body or b"")
            with res:
                return _Response(res.status, res.headers, res.read())
        except (OSError, http.client.HTTPException, urllib.error.URLError) as err:
            raise _NoAnswer(err) from err

    def _call(self, r: _Request) -> Any:
        """Run r and decode its JSON answer (None for an empty body)."""
        return _decode(r, self._do(r))


def _decode(r: _Request, resp: _Response) -> Any:
    """Decode the JSON of r's 2xx answer resp (None for an empty body)."""
    if not resp.body and not r.runs_twice:
        return None
    try:
        return _loads(resp.body)
    except ValueError as e:
        if r.runs_twice:
            # An exec that ran, or may have: its result is lost (an empty 200, say), never
            # read as a command that exited 0 (found by an attack).
            raise _lost_answer(r, resp, "is not the JSON Berth sends") from e
        raise error_for(INTERNAL, f"{r.method} {r.path}: the answer (HTTP {resp.status}) is not the JSON Berth sends: {e}",
                        status=resp.status) from e


def _lost_answer(r: _Request, resp: _Response, what: str) -> BerthError:
    """The outcome_unknown of a call that runs twice (exec) whose 2xx answer ``what`` (is not
    the JSON Berth sends, is not an exec result): it was sent and may have been done."""
    return BerthError(OUTCOME_UNKNOWN, f"{r.method} {r.path}: the answer (HTTP {resp.status}) {what}, after the request"
                      " was sent: it may have been done; check before sending it again",
                      retryable=False, status=resp.status)


def _loads(body: bytes) -> Any:
    """json.loads of a response body, as Go's encoding/json reads it, so the SDKs agree on
    what an answer says: UTF-8 only (invalid bytes become U+FFFD; json.loads would also take
    UTF-16 and UTF-32), a byte order mark refused, and no NaN or Infinity (not JSON; an exec
    body holding one read as a result here while Go and TypeScript refused it). A body nested
    deeper than Python's recursion allows (100,000 "[", say) raises RecursionError there. Each
    is undecodable JSON like any other (ValueError), never an exception the caller does not
    expect from a bad answer."""
    try:
        return json.loads(body.decode("utf-8", errors="replace"), parse_constant=_not_json)
    except RecursionError as e:
        raise ValueError(f"JSON nested too deep to decode: {e}") from e


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _NoAnswer(Exception):
    def __init__(self, err: BaseException) -> None:
        super().__init__(str(err))
        self.err = err


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _retryable_status(status: int) -> bool:
    return status in (502, 503, 504)


def _unwrap(err: BaseException) -> BaseException:
    """The exception under urllib's URLError (the connection phase's OSError)."""
    while isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError) \
            and isinstance(err.reason, BaseException):
        err = err.reason
    return err


def _not_sent(err: BaseException) -> bool:
    """Whether nothing of the request reached the server: urllib raises URLError only while
    connecting and sending (refused, DNS, a connect timeout, TLS, a send cut short, so the
    server never had the whole request); a failure while waiting for the answer is raw."""
    return isinstance(err, urllib.error.URLError)


def _error_detail(body: bytes) -> Optional[Dict[str, Any]]:
    """The inside of Berth's error envelope (API-2) in body, or None when body is not one:
    JSON whose "error" holds a non-empty code (the Go SDK's berth.ParseErrorBody)."""
    try:
        env = _loads(body)
    except ValueError:
        return None
    det = env.get("error") if isinstance(env, dict) else None
    if isinstance(det, dict) and isinstance(det.get("code"), str) and det["code"]:
        return det
    return None


def _retried_failure(err: BaseException) -> bool:
    """Whether an attempt's failure is one SDK-1 retries for idempotent calls (the Go SDK's
    connectionFailure plus its per-attempt timeout): any failure to connect (refused,
    unreachable, a name that does not resolve — the Go SDK's dial errors), resets and aborts,
    a hang-up before or during the answer, and timeouts. TLS failures, URL errors and
    malformed answers are not: a later try would fail the same way."""
    connect_phase = isinstance(err, urllib.error.URLError)
    inner = _unwrap(err)
    if isinstance(inner, (ssl.SSLError, ssl.CertificateError)):
        return False
    if isinstance(inner, (ConnectionError, socket.timeout, TimeoutError, http.client.IncompleteRead,
                          http.client.RemoteDisconnected)):
        return True
    # urllib wraps every OSError of connecting and sending (DNS, EHOSTUNREACH, …): a dial error.
    return connect_phase and isinstance(inner, OSError)


def _reason(err: BaseException) -> str:
    """Why a request got no answer, in a few words (the Go SDK's transportReason)."""
    inner = _unwrap(err)
    if isinstance(inner, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(inner, socket.gaierror):
        return f"cannot resolve host: {inner.strerror or inner}"
    if isinstance(inner, ConnectionRefusedError):
        return "connection refused"
    if isinstance(inner, (http.client.RemoteDisconnected, http.client.IncompleteRead)):
        return "the connection closed before an answer"
    if isinstance(inner, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return "the connection was reset"
    if isinstance(inner, ssl.SSLError):
        return f"TLS: {inner.reason or inner}"
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror[:1].lower() + inner.strerror[1:]  # "No route to host" → "no route to host"
    if isinstance(inner, urllib.error.URLError):
        return str(inner.reason)
    return str(inner) or type(inner).__name__


def _decode_error(status: int, headers: Any, body: bytes, now: float) -> BerthError:
    """Turn a non-2xx answer into its BerthError (API-2), as the Go SDK's decodeError. A body
    that is not Berth's envelope (a proxy's HTML page) yields code "unavailable" for 502/503/504
    and "internal" otherwise, with the status in the message; Go's answer to a plaintext
    request at a TLS port is invalid_request saying to use https://. retry_after_s comes from
    the body's retry_after_s, else the Retry-After header read against now."""
    request_id = headers.get("X-Request-Id", "") if headers is not None else ""
    det = _error_detail(body)
    if det is not None:
        ra_ns = _retry.seconds_ns(det.get("retry_after_s") or 0) if isinstance(det.get("retry_after_s"), (int, float)) else 0
        if ra_ns <= 0:
            d, ok = _retry.retry_after_header(headers, now)
            ra_ns = d if ok else 0
        hosts = det.get("hosts")
        retryable = det.get("retryable")
        return error_for(det["code"], str(det.get("message") or ""),
                         retryable=retryable if isinstance(retryable, bool) else None,
                         retry_after_s=ra_ns / _retry.NS, request_id=str(det.get("request_id") or request_id),
                         hosts={str(k): int(v) for k, v in hosts.items() if isinstance(v, int)} if isinstance(hosts, dict) else None,
                         status=status)
    if status == 400 and _PLAINTEXT_TO_TLS in body:
        return error_for(INVALID_REQUEST, "the server speaks HTTPS and this request went in clear: use an https:// URL", status=status)
    code = UNAVAILABLE if _retryable_status(status) else INTERNAL
    msg = f"HTTP {status} {_HTTP_REASONS.get(status, '')}".rstrip()
    snippet = body.decode("utf-8", "replace").strip()
    if snippet:
        if len(snippet) > 200:
            snippet = snippet[:200] + "…"
        msg += ": " + " ".join(snippet.split())
    d, ok = _retry.retry_after_header(headers, now) if headers is not None else (0, False)
    return error_for(code, msg, retry_after_s=(d if ok else 0) / _retry.NS, request_id=request_id, status=status)


def _seg(s: str) -> str:
    """One escaped path segment (Go's url.PathEscape: "/" too)."""
    return urllib.parse.quote(s, safe="")


def _json_body(v: Mapping[str, Any]) -> bytes:
    return json.dumps({k: x for k, x in v.items() if x is not None}, separators=(",", ":")).encode()


def _new_key() -> str:
    """A new Idempotency-Key: 128 random bits in hex (API-4)."""
    return secrets.token_hex(16)


def _rfc3339_arg(v: Union[None, str, datetime]) -> Optional[str]:
    if v is None or isinstance(v, str):
        return v
    if v.tzinfo is None:
        raise ValueError("a naive datetime has no time zone: give an aware one (e.g. tzinfo=timezone.utc)")
    return v.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class Sandboxes:
    """Sandbox calls (``client.sandboxes``), docs/API.md "Sandboxes"."""

    def __init__(self, c: Client) -> None:
        self._c = c

    def create(self, template: str, *, memory_mb: Optional[int] = None, vcpus: Optional[int] = None,
               ttl_seconds: Optional[int] = None, stateful: Optional[bool] = None, volume: Optional[str] = None,
               region: Optional[str] = None, pool: Optional[str] = None,
               metadata: Optional[Mapping[str, str]] = None, idempotency_key: Optional[str] = None) -> Sandbox:
        """Create a sandbox from ``template`` (POST /v1/sandboxes, 201) and return it running.

        ``memory_mb`` and ``vcpus`` override the template's; ``ttl_seconds`` (1…604,800,
        default 3600) bounds its life. One random Idempotency-Key (or ``idempotency_key``, to
        survive the caller's own restart) is sent on every attempt with the first attempt's
        time, so a retry after a lost answer returns the first sandbox instead of a second
        (API-4, SDK-3). Raises: NotFound (template_not_found), Forbidden (tenant_over_quota),
        InvalidRequest; CapacityUnavailable when no_capacity and kin persist past the deadline.
        """
        body = {"template": template, "memory_mb": memory_mb, "vcpus": vcpus, "ttl_seconds": ttl_seconds,
                "stateful": stateful or None, "volume": volume, "region": region, "pool": pool,
                "metadata": dict(metadata) if metadata else None}
        r = _Request("POST", "/v1/sandboxes", body=_json_body(body), content_type="application/json",
                     idempotent=True, idempotency_key=idempotency_key or _new_key(),
                     own_timeout_s=_PLACEMENT_ATTEMPT_S)
        return Sandbox.from_json(self._c._call(r))

    def get(self, sandbox_id: str) -> Sandbox:
        """Return one sandbox (GET /v1/sandboxes/{id}); NotFound (sandbox_not_found) when none
        is visible to the key — another tenant's included."""
        return Sandbox.from_json(self._c._call(_Request("GET", "/v1/sandboxes/" + _seg(sandbox_id), idempotent=True)))

    def list(self, state: Optional[str] = None) -> List[Sandbox]:
        """List the sandboxes visible to the key, newest first (GET /v1/sandboxes?state=), only
        those in ``state`` ("running", …) when given."""
        r = _Request("GET", "/v1/sandboxes", query={"state": state} if state else None, idempotent=True)
        out = self._c._call(r) or {}
        return [Sandbox.from_json(s) for s in out.get("sandboxes") or []]

    def exec(self, sandbox_id: str, cmd: Sequence[str], *, stdin: Union[None, str, bytes] = None,
             timeout_s: Optional[int] = None) -> ExecResult:
        """Run ``cmd`` (argv, e.g. ``["python3", "-c", "print(2+2)"]``) in the sandbox and return
        its exit code and output (POST /v1/sandboxes/{id}/exec). ``timeout_s`` is 1…3600,
        default 60; a timed-out command exits −1. Resent only on 429 rate_limited, which the
        server answers before running anything: running a command twice is not harmless, so any
        other refusal or a lost connection raises as it came (RetryableError, TransportError),
        and ``outcome_unknown`` means the command may have run: the server's 504 (the exec
        reached the sandbox's host, its answer was lost), or no answer of Berth's after the
        request was sent (a TransportError with that code: the connection broke or timed out;
        or a BerthError: a proxy's 502/503/504 page, or a 2xx whose body is not an exec result,
        ExecResult.from_answer — never read as exit code 0). Neither is retryable. Raises
        Conflict when the sandbox is not running."""
        if isinstance(cmd, (str, bytes)):
            raise TypeError("cmd is an argv list, e.g. ['sh', '-c', 'echo hi'], not a string")
        if isinstance(stdin, bytes):
            stdin = stdin.decode("utf-8")
        body = {"cmd": [str(a) for a in cmd], "stdin": stdin or None, "timeout_s": timeout_s}
        s = timeout_s if timeout_s and timeout_s > 0 else _DEFAULT_EXEC_S
        r = _Request("POST", "/v1/sandboxes/" + _seg(sandbox_id) + "/exec", body=_json_body(body),
                     content_type="application/json", idempotent=False,
                     own_timeout_s=min(s, _MAX_EXEC_S) + _ATTEMPT_MARGIN_S, runs_twice=True)
        resp = self._c._do(r)
        res = ExecResult.from_answer(_decode(r, resp))
        if res is None:
            # Not an exec result (null, {}, an exit_code missing or not an integer): never read
            # as exit code 0 — the command may have run, or not, or failed.
            raise _lost_answer(r, resp, "is not an exec result")
        return res

    def write_file(self, sandbox_id: str, path: str, data: Union[bytes, bytearray, str]) -> None:
        """Write ``data`` (bytes; a str is encoded as UTF-8) to the absolute ``path`` inside the
        sandbox, replacing the file whole (PUT /v1/sandboxes/{id}/files?path=, ≤ 64 MiB);
        parent directories are created. Retried: the same bytes twice leave the same file."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        r = _Request("PUT", "/v1/sandboxes/" + _seg(sandbox_id) + "/files", query={"path": path}, body=bytes(data),
                     content_type="application/octet-stream", idempotent=True, own_timeout_s=_TRANSFER_ATTEMPT_S)
        self._c._do(r)

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        """Return the content of the absolute ``path`` inside the sandbox (GET
        /v1/sandboxes/{id}/files?path=)."""
        r = _Request("GET", "/v1/sandboxes/" + _seg(sandbox_id) + "/files", query={"path": path},
                     idempotent=True, own_timeout_s=_TRANSFER_ATTEMPT_S)
        return self._c._do(r).body

    def delete(self, sandbox_id: str) -> None:
        """Stop and remove the sandbox (DELETE /v1/sandboxes/{id}, 204). Idempotent, so
        retried like a GET."""
        self._c._do(_Request("DELETE", "/v1/sandboxes/" + _seg(sandbox_id), idempotent=True))

    #: kill is delete (the CLI's word).
    kill = delete

    def pause(self, sandbox_id: str) -> Sandbox:
        """Checkpoint the running sandbox and stop it, freeing its host (POST
        /v1/sandboxes/{id}/pause, PAUSE-1); returns it paused. Retried (pausing a paused
        sandbox is harmless). Conflict when it is not running or its runtime cannot
        checkpoint (the process runtime)."""
        r = _Request("POST", "/v1/sandboxes/" + _seg(sandbox_id) + "/pause", idempotent=True,
                     own_timeout_s=_TRANSFER_ATTEMPT_S)
        return Sandbox.from_json(self._c._call(r))

    def resume(self, sandbox_id: str) -> Sandbox:
        """Place a paused sandbox again and restore it (POST /v1/sandboxes/{id}/resume,
        PAUSE-1); returns it running. Refusals are retried until the deadline, then
        CapacityUnavailable. Conflict when it is not paused."""
        r = _Request("POST", "/v1/sandboxes/" + _seg(sandbox_id) + "/resume", idempotent=True,
                     own_timeout_s=_PLACEMENT_ATTEMPT_S)
        return Sandbox.from_json(self._c._call(r))


class Apps:
    """App calls (``client.apps``), docs/API.md "Apps" (APP-1, APP-2)."""

    def __init__(self, c: Client) -> None:
        self._c = c

    def create(self, name: str, template: str, command: Sequence[str], port: int, *,
               memory_mb: Optional[int] = None, files: Optional[Mapping[str, str]] = None,
               env: Optional[Mapping[str, str]] = None, desired: Optional[str] = None,
               idle_seconds: Optional[int] = None) -> App:
        """Record an app (POST /v1/apps, 201): its first version — the sandbox template, the
        command of its HTTP server, the port it listens on — and whether it should run now
        (default), be "hibernated" until a request comes, or stay "stopped". The server starts
        it in the background: watch ``get(name).state``. Sent with one Idempotency-Key on every
        attempt, so a retry after a lost answer is not met by its own app as a conflict.
        Raises Conflict (name taken), NotFound (template_not_found), InvalidRequest."""
        spec = AppSpec(template=template, command=list(command), port=port, memory_mb=memory_mb or 0,
                       files=dict(files or {}), env=dict(env or {})).to_json()
        body: Dict[str, Any] = {"name": name, **spec, "desired": desired, "idle_seconds": idle_seconds}
        r = _Request("POST", "/v1/apps", body=_json_body(body), content_type="application/json",
                     idempotent=True, idempotency_key=_new_key())
        return App.from_json(self._c._call(r))

    def get(self, name: str) -> App:
        """Return one app (GET /v1/apps/{name}); NotFound (app_not_found) if none is visible."""
        return App.from_json(self._c._call(_Request("GET", "/v1/apps/" + _seg(name), idempotent=True)))

    def list(self) -> List[App]:
        """List the apps visible to the key, by name (GET /v1/apps)."""
        out = self._c._call(_Request("GET", "/v1/apps", idempotent=True)) or {}
        return [App.from_json(a) for a in out.get("apps") or []]

    def delete(self, name: str) -> None:
        """Stop the app's sandboxes and remove it (DELETE /v1/apps/{name}, 204)."""
        self._c._do(_Request("DELETE", "/v1/apps/" + _seg(name), idempotent=True))

    def deploy(self, name: str, template: str, command: Sequence[str], port: int, *,
               memory_mb: Optional[int] = None, files: Optional[Mapping[str, str]] = None,
               env: Optional[Mapping[str, str]] = None) -> App:
        """Make this spec the app's next version (POST /v1/apps/{name}/deploy, 202): a running
        app starts it beside the old one and switches once it answers; one that cannot be
        placed leaves the old version serving (APP-2). Each call is one new version: its
        attempts share one Idempotency-Key."""
        spec = AppSpec(template=template, command=list(command), port=port, memory_mb=memory_mb or 0,
                       files=dict(files or {}), env=dict(env or {})).to_json()
        r = _Request("POST", "/v1/apps/" + _seg(name) + "/deploy", body=_json_body(spec),
                     content_type="application/json", idempotent=True, idempotency_key=_new_key())
        return App.from_json(self._c._call(r))

    def _set(self, name: str, action: str) -> App:
        r = _Request("POST", "/v1/apps/" + _seg(name) + "/" + action, idempotent=True)
        return App.from_json(self._c._call(r))

    def hibernate(self, name: str) -> App:
        """Want the app hibernated: no sandbox until a request wakes it (202)."""
        return self._set(name, "hibernate")

    def wake(self, name: str) -> App:
        """Want a hibernated app running again (202)."""
        return self._set(name, "wake")

    def stop(self, name: str) -> App:
        """Want the app stopped: no sandbox, and requests get app_stopped (202)."""
        return self._set(name, "stop")

    def start(self, name: str) -> App:
        """Want a stopped app running (202)."""
        return self._set(name, "start")

    def set_idle(self, name: str, idle_seconds: int) -> App:
        """Hibernate the app after ``idle_seconds`` without a request, 0 for never (POST
        /v1/apps/{name}/idle, 202); it deploys nothing."""
        r = _Request("POST", "/v1/apps/" + _seg(name) + "/idle", body=_json_body({"idle_seconds": int(idle_seconds)}),
                     content_type="application/json", idempotent=True)
        return App.from_json(self._c._call(r))


class Events:
    """The event log (``client.events``), LIF-3."""

    def __init__(self, c: Client) -> None:
        self._c = c

    def list(self, entity: Optional[str] = None, *, type: Optional[str] = None,
             since: Union[None, str, datetime] = None, until: Union[None, str, datetime] = None,
             to: Optional[str] = None, limit: Optional[int] = None) -> List[Event]:
        """Return recorded state transitions, oldest first (GET /v1/events): of one entity
        ("sandbox/sb-1", "app/web") or of a kind when ``entity`` ends in "/" ("sandbox/");
        ``type`` ("sandbox", "agent", "reservation", "app"), ``since`` (inclusive) and
        ``until`` (exclusive; aware datetimes or RFC 3339), ``to`` (a state) and ``limit``
        (1…10,000) narrow it. A tenant key may read only its own sandboxes' and apps' events."""
        q = {"entity": entity, "type": type, "since": _rfc3339_arg(since), "until": _rfc3339_arg(until),
             "to": to, "limit": str(limit) if limit is not None else None}
        r = _Request("GET", "/v1/events", query={k: v for k, v in q.items() if v}, idempotent=True)
        out = self._c._call(r) or {}
        return [Event.from_json(e) for e in out.get("events") or []]


class Templates:
    """Templates (``client.templates``)."""

    def __init__(self, c: Client) -> None:
        self._c = c

    def list(self) -> List[Template]:
        """The templates sandboxes can be created from (GET /v1/templates; any key)."""
        out = self._c._call(_Request("GET", "/v1/templates", idempotent=True)) or {}
        return [Template.from_json(t) for t in out.get("templates") or []]


class Tenants:
    """Tenants and their API keys (``client.tenants``; admin key)."""

    def __init__(self, c: Client) -> None:
        self._c = c

    def create(self, name: str) -> Tenant:
        """Create a tenant (POST /v1/tenants, 201). Sent once, not retried; a taken name is
        Conflict."""
        r = _Request("POST", "/v1/tenants", body=_json_body({"name": name}), content_type="application/json")
        return Tenant.from_json(self._c._call(r))

    def create_key(self, tenant: str, role: str = "tenant") -> APIKeySecret:
        """Mint an API key for ``tenant`` with role "tenant" or "admin" (POST
        /v1/tenants/{name}/keys, 201). The secret (``.key``) is shown only in this answer.
        Sent once, not retried: a retry could mint a second secret."""
        r = _Request("POST", "/v1/tenants/" + _seg(tenant) + "/keys", body=_json_body({"role": role}),
                     content_type="application/json")
        return APIKeySecret.from_json(self._c._call(r))
