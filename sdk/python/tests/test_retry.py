"""The retry loop (SDK-1…3) end to end over real HTTP, against a scripted server on 127.0.0.1
that answers 503s, with a fake clock: every wait is recorded, none is really slept."""

from __future__ import annotations

import time
import unittest
from typing import List

import berth
from berth import (
    BerthError, CapacityUnavailable, Client, Conflict, InternalError, NotFound, RetryableError, TransportError,
)

from .fakes import SANDBOX, FakeClock, Reply, ScriptedServer, http_date, refusal, refused_url

CREATED = Reply(201, SANDBOX)


def half() -> float:
    return 0.5


class RetryCase(unittest.TestCase):
    def server(self, *script: Reply) -> ScriptedServer:
        s = ScriptedServer(*script)
        self.addCleanup(s.close)
        return s

    def client(self, url: str, clk: FakeClock, **kw: object) -> Client:
        return Client(url, "bk_test", clock=clk.now, sleep=clk.sleep, **kw)  # type: ignore[arg-type]


class RetryAfterHonoured(RetryCase):
    def test_503_with_retry_after_then_201(self) -> None:
        s = self.server(refusal("3"), refusal("2"), CREATED)
        clk = FakeClock(time.time())
        sb = self.client(s.url, clk).sandboxes.create("python", ttl_seconds=600, metadata={"job": "j1"})
        self.assertEqual(clk.sleeps, [3.0, 2.0], "waits are the server's Retry-After")
        self.assertEqual(sb.id, "sb-1")
        self.assertEqual(sb.state, "running")
        self.assertEqual(sb.expires_at.microsecond, 779123)  # nanoseconds from Go, cut to µs
        seen = s.requests()
        self.assertEqual(len(seen), 3)
        # SDK-3: one Idempotency-Key and one first-attempt time on every attempt, attempts numbered.
        keys = {r.headers["Idempotency-Key"] for r in seen}
        firsts = {r.headers["Berth-First-Attempt"] for r in seen}
        self.assertEqual(len(keys), 1)
        self.assertRegex(keys.pop(), r"^[0-9a-f]{32}$")
        self.assertEqual(len(firsts), 1)
        self.assertRegex(firsts.pop(), r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
        self.assertEqual([r.headers["Berth-Attempt"] for r in seen], ["1", "2", "3"])
        self.assertEqual(seen[0].headers["Authorization"], "Bearer bk_test")
        self.assertEqual(seen[0].body, b'{"template":"python","ttl_seconds":600,"metadata":{"job":"j1"}}')
        self.assertEqual({r.body for r in seen}, {seen[0].body}, "every attempt sends the same body")

    def test_each_create_call_has_its_own_key(self) -> None:
        s = self.server(CREATED)
        c = self.client(s.url, FakeClock(time.time()))
        c.sandboxes.create("python")
        c.sandboxes.create("python", idempotency_key="my-job-17")
        keys = [r.headers["Idempotency-Key"] for r in s.requests()]
        self.assertNotEqual(keys[0], keys[1])
        self.assertEqual(keys[1], "my-job-17")

    def test_http_date_read_against_the_server_date(self) -> None:  # C01
        s = self.server(refusal(http_date(time.time() + 7)), CREATED)
        clk = FakeClock(time.time() + 5 * 365 * 86400)  # the client's clock is years off
        self.client(s.url, clk).sandboxes.create("python")
        self.assertEqual(len(clk.sleeps), 1)
        self.assertTrue(6 <= clk.sleeps[0] <= 8, clk.sleeps)

    def test_http_date_without_date_header(self) -> None:
        r = refusal(http_date(time.time() + 7))
        r.headers["Date"] = ""
        s = self.server(r, CREATED)
        clk = FakeClock(time.time())
        self.client(s.url, clk).sandboxes.create("python")
        self.assertEqual(len(clk.sleeps), 1)
        self.assertTrue(6 <= clk.sleeps[0] <= 8, clk.sleeps)

    def test_past_dates_never_twice_at_once(self) -> None:  # C01
        s = self.server(refusal(http_date(time.time() - 3600)))
        clk = FakeClock(time.time())
        with self.assertRaises(CapacityUnavailable):
            self.client(s.url, clk, rand=half, deadline_s=2).sandboxes.get("sb-1")
        # at once, jitter (window 0.5 s), at once, jitter (window 2 s), at once; the next
        # jittered wait (window 8 s → 4 s) would pass the deadline. Same as the Go SDK.
        self.assertEqual(clk.sleeps, [0, 0.25, 0, 1.0, 0])

    def test_malformed_retry_after_falls_back_to_jitter(self) -> None:  # C02
        for v in ("-3", "soon", "1.5", "+5", "1e9", "Fri, 32 Dec 2030 23:59:59 GMT"):
            with self.subTest(v=v):
                s = self.server(refusal(v), CREATED)
                clk = FakeClock(time.time())
                self.client(s.url, clk, rand=half).sandboxes.create("python")
                self.assertEqual(clk.sleeps, [0.125], "half the first window (0.25 s)")


class Deadline(RetryCase):
    def test_always_503_raises_capacity_unavailable_past_the_deadline(self) -> None:
        s = self.server(refusal("7", hosts={"total": 2, "insufficient_memory": 2}))
        clk = FakeClock(time.time())
        with self.assertRaises(CapacityUnavailable) as cm:
            self.client(s.url, clk, deadline_s=30).sandboxes.create("python")
        cu = cm.exception
        total = sum(clk.sleeps)
        self.assertEqual(clk.sleeps, [7.0] * 4, "30 s holds four 7 s waits, not a fifth")
        self.assertEqual(cu.attempts, len(s.requests()))
        self.assertEqual(cu.attempts, len(clk.sleeps) + 1)
        self.assertEqual(cu.elapsed_s, total)
        self.assertEqual(cu.code, "no_capacity")
        self.assertEqual(cu.last_code, "no_capacity")
        self.assertEqual(cu.retry_after_s, 7.0)
        self.assertEqual(cu.hosts, {"total": 2, "insufficient_memory": 2})
        self.assertEqual(cu.request_id, "req-1")
        self.assertTrue(cu.retryable)
        self.assertIsInstance(cu, BerthError)
        self.assertIs(cu.__cause__, cu.last)
        self.assertEqual(str(cu), "berth: capacity unavailable after 5 attempts in 28s "
                                  "(last: no_capacity: no host fits 512 MiB; Retry-After 7s)")

    def test_default_deadline_is_90_s_with_full_jitter(self) -> None:
        s = self.server(refusal(""))
        clk = FakeClock(time.time())
        with self.assertRaises(CapacityUnavailable) as cm:
            self.client(s.url, clk, rand=half).sandboxes.get("sb-1")
        # half of 0.25, 0.5, 1, 2, 4, then half the 8 s cap until the next would pass 90 s.
        want = [0.125, 0.25, 0.5, 1.0, 2.0] + [4.0] * 21
        self.assertEqual(clk.sleeps, want)
        self.assertLessEqual(sum(clk.sleeps), 90)
        self.assertGreater(sum(clk.sleeps) + 4.0, 90)
        self.assertEqual(cm.exception.retry_after_s, 0)

    def test_jitter_stays_inside_the_window_and_the_deadline(self) -> None:
        s = self.server(refusal(""))
        clk = FakeClock(time.time())
        with self.assertRaises(CapacityUnavailable):
            self.client(s.url, clk, deadline_s=20, backoff_base_s=0.5, backoff_cap_s=4).sandboxes.get("sb-1")
        for i, w in enumerate(clk.sleeps):
            self.assertTrue(0 <= w < min(4.0, 0.5 * 2**i), (i, w))
        self.assertLessEqual(sum(clk.sleeps), 20)

    def test_retry_after_past_the_deadline_gives_up_at_once(self) -> None:  # C30
        for v in ("86401", "20251231", "9" * 20, http_date(time.time() + 3600)):
            with self.subTest(v=v):
                s = self.server(refusal(v))
                clk = FakeClock(time.time())
                with self.assertRaises(CapacityUnavailable) as cm:
                    self.client(s.url, clk).sandboxes.create("python")
                self.assertEqual(clk.sleeps, [])
                self.assertEqual(len(s.requests()), 1)
                self.assertEqual(cm.exception.attempts, 1)
                self.assertEqual(cm.exception.elapsed_s, 0)
                self.assertGreater(cm.exception.retry_after_s, 90)

    def test_retry_notify(self) -> None:
        s = self.server(refusal("1"), refusal(""), CREATED)
        clk = FakeClock(time.time())
        seen: List[berth.Retry] = []
        self.client(s.url, clk, rand=half, on_retry=seen.append).sandboxes.create("python")
        self.assertEqual([(r.attempt, r.wait_s, r.from_retry_after, r.last.code) for r in seen],
                         [(1, 1.0, True, "no_capacity"), (2, 0.25, False, "no_capacity")])


class WhatIsRetried(RetryCase):
    def test_retried_statuses_and_codes(self) -> None:
        for first in (refusal("", code="unavailable", status=502), refusal("", code="unavailable", status=504),
                      refusal("1", code="rate_limited", status=429),
                      Reply(502, b"<html>Bad Gateway</html>", {"Content-Type": "text/html"})):
            with self.subTest(status=first.status):
                s = self.server(first, Reply(200, SANDBOX))
                clk = FakeClock(time.time())
                self.assertEqual(self.client(s.url, clk).sandboxes.get("sb-1").id, "sb-1")
                self.assertEqual(len(s.requests()), 2)

    def test_a_proxy_page_is_unavailable(self) -> None:
        s = self.server(Reply(502, b"<html>\n Bad   Gateway</html>", {"Content-Type": "text/html", "Retry-After": "2"}))
        clk = FakeClock(time.time())
        with self.assertRaises(CapacityUnavailable) as cm:
            self.client(s.url, clk, deadline_s=5).sandboxes.get("sb-1")
        self.assertEqual(clk.sleeps, [2.0, 2.0])
        self.assertEqual(cm.exception.code, "unavailable")
        self.assertEqual(cm.exception.message, "HTTP 502 Bad Gateway: <html> Bad Gateway</html>")
        self.assertEqual(cm.exception.status, 502)
        self.assertIn("server unavailable after 3 attempts", str(cm.exception))

    def test_other_answers_raise_at_once(self) -> None:
        cases = [
            (refusal(code="sandbox_not_found", status=404, retryable=False), NotFound, "sandbox_not_found"),
            (refusal(code="conflict", status=409, retryable=False), Conflict, "conflict"),
            (refusal("5", code="other_429", status=429), BerthError, "other_429"),
            (refusal(code="internal", status=500, retryable=False), InternalError, "internal"),
            (Reply(500, b"oops"), InternalError, "internal"),
            (refusal("3", code="tenant_over_quota", status=403, retryable=False), berth.Forbidden, "tenant_over_quota"),
        ]
        for reply, cls, code in cases:
            with self.subTest(code=code):
                s = self.server(reply)
                clk = FakeClock(time.time())
                with self.assertRaises(cls) as cm:
                    self.client(s.url, clk).sandboxes.get("sb-1")
                self.assertEqual(cm.exception.code, code)
                self.assertEqual(cm.exception.status, reply.status)
                self.assertNotIsInstance(cm.exception, CapacityUnavailable)
                self.assertEqual(len(s.requests()), 1)
                self.assertEqual(clk.sleeps, [])

    def test_envelope_fields(self) -> None:
        s = self.server(refusal(code="sandbox_not_found", status=404, retryable=False, retry_after_s=0,
                                message="no sandbox sb-9"))
        with self.assertRaises(NotFound) as cm:
            self.client(s.url, FakeClock(time.time())).sandboxes.get("sb-9")
        e = cm.exception
        self.assertEqual((e.code, e.message, e.retryable, e.request_id, e.status),
                         ("sandbox_not_found", "no sandbox sb-9", False, "req-1", 404))
        self.assertEqual(str(e), "sandbox_not_found: no sandbox sb-9")

    def test_body_retry_after_s_wins_for_the_error(self) -> None:
        s = self.server(refusal("9", code="no_capacity", retry_after_s=4))
        with self.assertRaises(RetryableError) as cm:  # exec is never retried
            self.client(s.url, FakeClock(time.time())).sandboxes.exec("sb-1", ["true"])
        self.assertEqual(cm.exception.retry_after_s, 4.0)

    def test_exec_is_sent_once(self) -> None:
        s = self.server(refusal("1"))
        clk = FakeClock(time.time())
        with self.assertRaises(RetryableError) as cm:
            self.client(s.url, clk).sandboxes.exec("sb-1", ["python3", "-c", "print(2+2)"], timeout_s=5)
        self.assertEqual(cm.exception.code, "no_capacity")
        self.assertEqual(len(s.requests()), 1)
        self.assertEqual(s.requests()[0].body, b'{"cmd":["python3","-c","print(2+2)"],"timeout_s":5}')
        self.assertNotIn("Idempotency-Key", s.requests()[0].headers)

    def test_exec_whose_answer_is_lost_is_outcome_unknown(self) -> None:
        # An exec that may have reached Berth with no answer of Berth's back may have run:
        # outcome_unknown, not retryable, sent once (the Go SDK's
        # TestExecWhoseAnswerIsLostIsOutcomeUnknown). One that never left stays unreachable.
        ran = Reply(200, {"exit_code": 0, "stdout": "", "stderr": ""})
        # A 200 that is not an exec result (ExecResult.from_answer, the Go package's
        # berth.ParseExecResult) read as exit code 0 before; the empty one was found by an attack.
        not_results = (b"", b"null", b"{}", b"[]", b'{"stdout":"hi"}', b'{"exit_code":"0"}', b'{"exit_code":1.5}',
                       # Not JSON as Go reads it, read as results here before (found by an attack):
                       # NaN and Infinity, a byte order mark, UTF-16 and UTF-32.
                       b'{"exit_code":0,"x":NaN}', b'{"exit_code":1,"x":-Infinity}', b'\xef\xbb\xbf{"exit_code":0}',
                       '{"exit_code":7}'.encode("utf-16-le"), '{"exit_code":0}'.encode("utf-32"))
        for reply, kind in ((Reply(hangup=True), TransportError),
                            (Reply(503, b"<html>no healthy upstream</html>"), BerthError),
                            *((Reply(200, b), BerthError) for b in not_results)):
            with self.subTest(hangup=reply.hangup, status=reply.status, body=reply.body):
                s = self.server(reply, ran)
                with self.assertRaises(kind) as cm:
                    self.client(s.url, FakeClock(time.time())).sandboxes.exec("sb-1", ["true"])
                e = cm.exception
                self.assertEqual(e.code, "outcome_unknown", str(e))
                self.assertFalse(e.retryable)
                self.assertNotIsInstance(e, RetryableError)
                self.assertIn("may have been done", str(e))
                self.assertEqual(len(s.requests()), 1)
        with self.assertRaises(TransportError) as cm:
            self.client(refused_url(), FakeClock(time.time())).sandboxes.exec("sb-1", ["true"])
        self.assertEqual(cm.exception.code, "unavailable")
        self.assertTrue(cm.exception.unreachable)

    def test_exec_result_is_an_integer_exit_code(self) -> None:
        # What the Go package's berth.ParseExecResult takes, this SDK takes (an integer
        # written as a float included), and nothing else.
        R = berth.ExecResult
        for d, want in (({"exit_code": 0, "stdout": "hi\n", "stderr": ""}, R(0, "hi\n", "")),
                        ({"exit_code": -1, "stdout": None}, R(-1, "", "")),
                        ({"exit_code": 2.0}, R(2, "", "")),
                        ({"exit_code": 2**53 - 1}, R(2**53 - 1, "", "")),
                        (None, None), ({}, None), ([], None), ("0", None), (0, None),
                        ({"stdout": "hi"}, None), ({"exit_code": "0"}, None), ({"exit_code": None}, None),
                        ({"exit_code": True}, None), ({"exit_code": 1.5}, None), ({"exit_code": 2**53}, None),
                        ({"exit_code": float("inf")}, None), ({"exit_code": float("nan")}, None),
                        ({"exit_code": 0, "stdout": 5}, None)):
            with self.subTest(d=d):
                self.assertEqual(R.from_answer(d), want)
        s = self.server(Reply(200, b'{"exit_code":3.0,"stderr":"no"}'))
        res = self.client(s.url, FakeClock(time.time())).sandboxes.exec("sb-1", ["false"])
        self.assertEqual((res.exit_code, res.stdout, res.stderr), (3, "", "no"))

    def test_body_nested_too_deep_is_undecodable(self) -> None:
        # A body nested 100,000 levels deep raised RecursionError out of the client; it is
        # undecodable JSON like any other: not Berth's error envelope on an error status, and
        # outcome_unknown on an exec's 200.
        for deep in (b"[" * 100000, b"[" * 100000 + b"]" * 100000, b'{"error":' * 100000):
            with self.subTest(body=deep[:12]):
                s = self.server(Reply(500, deep), Reply(200, deep))
                c = self.client(s.url, FakeClock(time.time()))
                with self.assertRaises(InternalError) as cm:
                    c.sandboxes.get("sb-1")
                self.assertEqual((cm.exception.code, cm.exception.status), ("internal", 500))
                with self.assertRaises(BerthError) as cm:
                    c.sandboxes.exec("sb-1", ["true"])
                self.assertEqual(cm.exception.code, "outcome_unknown", str(cm.exception))
                self.assertFalse(cm.exception.retryable)
                self.assertEqual(len(s.requests()), 2)
        # An undecodable 2xx on an ordinary call is InternalError, as a 500 is.
        for body in (b"[" * 100000, b"<html>"):
            s = self.server(Reply(200, body))
            with self.assertRaises(InternalError) as cm:
                self.client(s.url, FakeClock(time.time())).sandboxes.get("sb-1")
            self.assertEqual(cm.exception.code, "internal")

    def test_rate_limited_exec_is_sent_again(self) -> None:
        # A 429 rate_limited is answered before anything runs, so even exec is sent again,
        # after its Retry-After, with the same body (the Go SDK's TestRateLimitedIsRetriedForEveryCall).
        s = self.server(refusal("1", code="rate_limited", status=429),
                        Reply(200, {"exit_code": 0, "stdout": "hi\n", "stderr": ""}))
        clk = FakeClock(time.time())
        res = self.client(s.url, clk).sandboxes.exec("sb-1", ["echo", "hi"])
        self.assertEqual(res.stdout, "hi\n")
        self.assertEqual(len(s.requests()), 2)
        self.assertEqual(s.requests()[0].body, s.requests()[1].body)
        self.assertEqual(clk.sleeps, [1.0])

    def test_tenant_and_key_creation_are_sent_once(self) -> None:
        s = self.server(refusal("1", code="unavailable"))
        c = self.client(s.url, FakeClock(time.time()))
        with self.assertRaises(RetryableError):
            c.tenants.create("t1")
        with self.assertRaises(RetryableError):
            c.tenants.create_key("t1")
        self.assertEqual(len(s.requests()), 2)

    def test_app_calls_carry_one_key_per_call(self) -> None:
        app = {"name": "web", "tenant": "default", "spec": {"template": "python", "command": ["python3"], "port": 8080},
               "version": 1, "desired": "running", "state": "deploying", "incarnation": 0, "idle_seconds": 0,
               "revision": 1, "created_at": "2026-12-01T11:10:53.321Z", "updated_at": "2026-12-01T11:10:53.321Z"}
        s = self.server(refusal("1"), Reply(201, app), refusal("1"), Reply(202, app))
        clk = FakeClock(time.time())
        c = self.client(s.url, clk)
        a = c.apps.create("web", "python", ["python3", "-m", "http.server", "8080"], 8080)
        self.assertEqual((a.name, a.state, a.spec.port, a.version), ("web", "deploying", 8080, 1))
        c.apps.deploy("web", "python", ["python3", "-m", "http.server", "8080"], 8080)
        keys = [r.headers.get("Idempotency-Key") for r in s.requests()]
        self.assertEqual(len(keys), 4)
        self.assertEqual(keys[0], keys[1])
        self.assertEqual(keys[2], keys[3])
        self.assertNotEqual(keys[0], keys[2])
        self.assertEqual(clk.sleeps, [1.0, 1.0])


class NoAnswer(RetryCase):
    def test_connection_refused_is_retried_for_idempotent_calls(self) -> None:
        url = refused_url()
        clk = FakeClock(time.time())
        with self.assertRaises(CapacityUnavailable) as cm:
            self.client(url, clk, rand=half, deadline_s=5).sandboxes.get("sb-1")
        cu = cm.exception
        self.assertEqual(cu.code, "unavailable")
        self.assertIsInstance(cu.transport_error, TransportError)
        self.assertEqual(cu.transport_error.reason, "connection refused")
        self.assertEqual(clk.sleeps, [0.125, 0.25, 0.5, 1.0, 2.0])
        self.assertIn("server unavailable after 6 attempts", str(cu))
        self.assertIn("connection refused", str(cu))

    def test_connection_refused_is_not_retried_for_exec(self) -> None:
        url = refused_url()
        clk = FakeClock(time.time())
        with self.assertRaises(TransportError) as cm:
            self.client(url, clk).sandboxes.exec("sb-1", ["true"])
        self.assertEqual(clk.sleeps, [])
        self.assertTrue(cm.exception.unreachable)
        self.assertEqual(str(cm.exception), f"berth: POST /v1/sandboxes/sb-1/exec: no answer from {url}: connection refused")

    def test_hangup_before_the_answer_is_retried(self) -> None:
        s = self.server(Reply(hangup=True), Reply(200, SANDBOX))
        clk = FakeClock(time.time())
        self.assertEqual(self.client(s.url, clk, rand=half).sandboxes.get("sb-1").id, "sb-1")
        self.assertEqual(len(s.requests()), 2)
        self.assertEqual(clk.sleeps, [0.125])


class Misc(unittest.TestCase):
    def test_env_defaults(self) -> None:
        import os
        from unittest import mock
        with mock.patch.dict(os.environ, {"BERTH_URL": "http://127.0.0.9:1234/", "BERTH_KEY": "bk_env"}):
            c = Client()
            self.assertEqual(c.url, "http://127.0.0.9:1234")
            self.assertEqual(c._key, "bk_env")
            self.assertEqual(Client(key="k2")._key, "k2")
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertEqual(Client().url, "http://127.0.0.1:7070")
            self.assertEqual(Client().deadline_s, 90.0)
        self.assertNotIn("bk_env", repr(Client(key="bk_env")))

    def test_bad_url_and_ca_over_http(self) -> None:
        with self.assertRaises(berth.InvalidRequest) as cm:
            Client("127.0.0.1:7070")
        self.assertIn("did you mean http://127.0.0.1:7070", str(cm.exception))
        with self.assertRaises(berth.InvalidRequest):
            Client("http://127.0.0.1:7070", ca_file="/nonexistent.pem")
        with self.assertRaises(berth.InvalidRequest) as cm:
            Client("https://127.0.0.1:7070", ca_file="/nonexistent.pem")
        self.assertIn("/nonexistent.pem", str(cm.exception))
        import os
        from unittest import mock
        with mock.patch.dict(os.environ, {"BERTH_CA": "/nonexistent.pem"}):
            Client("http://127.0.0.1:7070")  # BERTH_CA does not apply to http://, as in the CLI
            with self.assertRaises(berth.InvalidRequest):
                Client("https://127.0.0.1:7070")

    def test_exec_wants_an_argv(self) -> None:
        with self.assertRaises(TypeError):
            Client("http://127.0.0.1:1").sandboxes.exec("sb-1", "echo hi")


if __name__ == "__main__":
    unittest.main()
