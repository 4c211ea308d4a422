"""Test helpers: a fake clock that never sleeps, and a scripted HTTP server on 127.0.0.1 that
answers 503s (the one fake the tests allow: a real server cannot be made to refuse on cue)."""

from __future__ import annotations

import json
import socket
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple

SANDBOX = {
    "id": "sb-1", "template": "python", "tenant": "default", "agent_id": "dev-agent-1",
    "state": "running", "memory_mb": 512, "vcpus": 1, "stateful": False,
    "created_at": "2026-12-01T11:10:46.779Z", "expires_at": "2026-12-01T12:10:46.779123456Z",
    "reason": "agent started it",
}


class FakeClock:
    """now() is seconds since the epoch; sleep(d) records d and moves now on by d, at once.
    More than max_sleeps sleeps fail the test (AssertionError out of the client), so a retry
    loop that never reaches its deadline fails instead of hammering the server forever."""

    def __init__(self, start: float, max_sleeps: int = 1000) -> None:
        self.t = start
        self.sleeps: List[float] = []
        self.max_sleeps = max_sleeps
        self.lock = threading.Lock()

    def now(self) -> float:
        with self.lock:
            return self.t

    def sleep(self, d: float) -> None:
        with self.lock:
            if len(self.sleeps) >= self.max_sleeps:
                raise AssertionError(f"more than {self.max_sleeps} retries: the loop does not end")
            self.sleeps.append(d)
            self.t += d


class Reply:
    """One scripted answer: status, headers, body (a dict is sent as JSON). hangup closes the
    connection without answering."""

    def __init__(self, status: int = 200, body: object = b"", headers: Optional[Dict[str, str]] = None,
                 hangup: bool = False) -> None:
        self.status = status
        self.body = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        self.headers = dict(headers or {})
        self.hangup = hangup


def refusal(retry_after: str = "", code: str = "no_capacity", status: int = 503, **extra: object) -> Reply:
    """A Berth refusal with the error envelope and, when given, a Retry-After header."""
    err = {"code": code, "message": "no host fits 512 MiB", "retryable": True, "retry_after_s": 0,
           "request_id": "req-1"}
    err.update(extra)
    h = {"X-Request-Id": "req-1"}
    if retry_after:
        h["Retry-After"] = retry_after
    return Reply(status, {"error": err}, h)


class Seen:
    def __init__(self, method: str, path: str, headers: Dict[str, str], body: bytes) -> None:
        self.method, self.path, self.headers, self.body = method, path, headers, body


class ScriptedServer:
    """An HTTP server on 127.0.0.1, port 0, answering each request with the next Reply of its
    script; the last one repeats. Every request is recorded in seen. Stop it with close()."""

    def __init__(self, *script: Reply) -> None:
        self.script = list(script)
        self.seen: List[Seen] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:  # quiet
                pass

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with outer.lock:
                    outer.seen.append(Seen(self.command, self.path, {k: v for k, v in self.headers.items()}, body))
                    r = outer.script[0] if len(outer.script) == 1 else outer.script.pop(0)
                if r.hangup:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response_only(r.status)
                h = dict(r.headers)
                h.setdefault("Date", formatdate(usegmt=True))
                h.setdefault("Content-Type", "application/json")
                for k, v in h.items():
                    if v != "":  # "" removes a default header (Date)
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(r.body)
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        host, port = self.httpd.server_address[:2]
        self.url = f"http://{host}:{port}"

    def requests(self) -> List[Seen]:
        with self.lock:
            return list(self.seen)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def refused_url() -> str:
    """A loopback URL where nothing listens (a port just bound and released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def http_date(t: float) -> str:
    return formatdate(t, usegmt=True)


def pair(d: Tuple[int, bool]) -> Tuple[float, bool]:
    """A (nanoseconds, present) pair in seconds, for readable assertions."""
    return d[0] / 1e9, d[1]
