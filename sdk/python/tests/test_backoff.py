"""Unit tests of the SDK-1 arithmetic (berth._retry), on fixed inputs and a fake clock: the
full-jitter window and its cap, the jitter's bounds, Retry-After in both forms (C01, C02, C30)."""

from __future__ import annotations

import math
import random
import time
import unittest
from email.utils import formatdate

from berth import _retry
from berth._retry import MAX_RETRY_AFTER_NS, NS, backoff_ns, jitter_ns, parse_retry_after, retry_after_header

MS = 1_000_000


class BackoffWindow(unittest.TestCase):
    def test_doubles_from_the_base_up_to_the_cap(self) -> None:
        want = [250 * MS, 500 * MS, 1 * NS, 2 * NS, 4 * NS, 8 * NS, 8 * NS, 8 * NS]
        self.assertEqual([backoff_ns(a) for a in range(8)], want)

    def test_never_overflows_and_stays_in_0_cap(self) -> None:  # C04
        for a in (62, 63, 64, 1000, 10_000, 2**40):
            self.assertEqual(backoff_ns(a), 8 * NS, a)
        self.assertEqual(backoff_ns(-1), 250 * MS, "a negative attempt counts as 0")

    def test_defaults_and_base_above_cap(self) -> None:
        self.assertEqual(backoff_ns(0, 0, 0), 250 * MS)
        self.assertEqual(backoff_ns(3, -5, -5), 2 * NS)
        self.assertEqual(backoff_ns(0, 10 * NS, 2 * NS), 2 * NS, "a base above the cap is lowered to it")
        self.assertEqual(backoff_ns(2, 100 * MS, 1 * NS), 400 * MS)


class Jitter(unittest.TestCase):
    def test_uniform_inside_the_window(self) -> None:
        w = 8 * NS
        self.assertEqual(jitter_ns(w, 0.5), 4 * NS)
        self.assertEqual(jitter_ns(w, 0.0), 0)
        rng = random.Random(1)
        for _ in range(10_000):
            d = jitter_ns(w, rng.random())
            self.assertTrue(0 <= d < w, d)

    def test_a_faulty_source_cannot_stretch_the_sleep(self) -> None:
        w = 2 * NS
        for r in (1.0, 2.0, math.inf, 1 - 1e-17, math.nextafter(1.0, 0.0)):
            self.assertEqual(jitter_ns(w, r), w - 1, r)
        for r in (-1.0, math.nan, -math.inf):
            self.assertEqual(jitter_ns(w, r), 0, r)

    def test_spreads_simultaneous_refusals(self) -> None:  # C05
        rng = random.Random(7)
        waits = [jitter_ns(backoff_ns(0), rng.random()) for _ in range(50)]
        self.assertGreater(len(set(waits)), 45)
        self.assertLess(min(waits), 50 * MS)
        self.assertGreater(max(waits), 200 * MS)


class RetryAfter(unittest.TestCase):
    NOW = 1_780_000_000.0  # a fixed "now", seconds since the epoch

    def test_delta_seconds(self) -> None:
        self.assertEqual(parse_retry_after("7", self.NOW), (7 * NS, True))
        self.assertEqual(parse_retry_after(" 0 ", self.NOW), (0, True))
        self.assertEqual(parse_retry_after("86401", self.NOW), (86401 * NS, True))
        self.assertEqual(parse_retry_after("20251231", self.NOW), (20251231 * NS, True))  # C30: seconds, not a date

    def test_huge_values_saturate(self) -> None:  # C30
        self.assertEqual(parse_retry_after("9" * 20, self.NOW), (MAX_RETRY_AFTER_NS, True))
        self.assertEqual(parse_retry_after("9" * 400, self.NOW), (MAX_RETRY_AFTER_NS, True))

    def test_malformed_is_absent(self) -> None:  # C02
        for v in ("", "-3", "soon", "1.5", "+5", "1e9", "Fri, 32 Dec 2030 23:59:59 GMT",
                  "Fri, 31 Dec 2030 25:00:00 GMT", "Fri, 31 Dec 2030 23:59:59 CET", "٣"):
            self.assertEqual(parse_retry_after(v, self.NOW), (0, False), v)

    def test_http_date_all_three_forms(self) -> None:  # C01
        t = self.NOW + 7
        imf = formatdate(t, usegmt=True)  # "Sun, 06 Nov 1994 08:49:37 GMT"
        st = time.gmtime(t)
        rfc850 = time.strftime("%A, %d-%b-%y %H:%M:%S GMT", st)
        asctime = time.strftime("%a %b ", st) + f"{st.tm_mday:2d}" + time.strftime(" %H:%M:%S %Y", st)
        for v in (imf, rfc850, asctime):
            self.assertEqual(parse_retry_after(v, self.NOW), (7 * NS, True), v)

    def test_a_past_date_means_at_once(self) -> None:  # C01
        self.assertEqual(parse_retry_after(formatdate(self.NOW - 3600, usegmt=True), self.NOW), (0, True))
        self.assertEqual(parse_retry_after(formatdate(self.NOW, usegmt=True), self.NOW), (0, True))

    def test_date_read_against_the_answer_date(self) -> None:
        # The local clock is years off; the server's Date header gives the right wait.
        server_now = self.NOW
        h = {"Retry-After": formatdate(server_now + 30, usegmt=True), "Date": formatdate(server_now, usegmt=True)}
        self.assertEqual(retry_after_header(h, local_now=server_now + 5 * 365 * 86400), (30 * NS, True))
        # Without Date: against the local clock.
        self.assertEqual(retry_after_header({"retry-after": formatdate(server_now + 30, usegmt=True)}, server_now + 10),
                         (20 * NS, True))
        self.assertEqual(retry_after_header({}, server_now), (0, False))

    def test_body_seconds(self) -> None:
        self.assertEqual(_retry.seconds_ns(3), 3 * NS)
        self.assertEqual(_retry.seconds_ns(0), 0)
        self.assertEqual(_retry.seconds_ns(-2), 0)
        self.assertEqual(_retry.seconds_ns(10**30), MAX_RETRY_AFTER_NS)


if __name__ == "__main__":
    unittest.main()
