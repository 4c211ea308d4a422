// SDK-1 without a server: the full-jitter window (C04), the jitter clamp, and the reading of
// Retry-After in both forms (C01, C02, C30); then the whole backoff schedule of a retried
// call on a fake clock, against a 127.0.0.1 server that answers 503 without a hint.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { backoff, Berth, CapacityUnavailable, jitter, parseHttpDate, parseRetryAfter, retryAfterFromHeaders } from "@berth/sdk";

import { fakeClock, refuse, serve } from "../testutil/fake.mjs";

describe("backoff window (SDK-1, C04)", () => {
  test("doubles from 0.25 s and stops at the 8 s cap", () => {
    assert.deepEqual([0, 1, 2, 3, 4, 5, 6, 7].map((a) => backoff(a)), [0.25, 0.5, 1, 2, 4, 8, 8, 8]);
  });
  test("stays in (0, cap] for huge, negative and NaN attempts", () => {
    for (const a of [64, 1000, 10_000, 1e308, Infinity]) assert.equal(backoff(a), 8, `attempt ${a}`);
    for (const a of [-1, -1e9, NaN, -Infinity]) assert.equal(backoff(a), 0.25, `attempt ${a}`);
  });
  test("non-positive base and cap take their defaults; a base above the cap is lowered to it", () => {
    assert.equal(backoff(0, 0, 0), 0.25);
    assert.equal(backoff(10, -1, -1), 8);
    assert.equal(backoff(0, 10, 2), 2);
    assert.equal(backoff(3, 1, 100), 8);
  });
});

describe("jitter", () => {
  test("is r·window, clamped into [0, window)", () => {
    assert.equal(jitter(8, 0.5), 4);
    assert.equal(jitter(8, 0), 0);
    for (const r of [-1, NaN, -Infinity]) assert.equal(jitter(8, r), 0, `r=${r}`);
    for (const r of [1, 2, Infinity, 1 - 2 ** -53]) {
      const d = jitter(8, r);
      assert.ok(d < 8 && d > 7.99, `r=${r} gave ${d}`);
    }
  });
});

describe("Retry-After (C01, C02, C30)", () => {
  const now = Date.UTC(2026, 0, 1, 12, 0, 0); // Thu, 01 Jan 2026 12:00:00 GMT
  test("delta-seconds of any size are seconds", () => {
    assert.equal(parseRetryAfter("7", now), 7);
    assert.equal(parseRetryAfter(" 7 ", now), 7);
    assert.equal(parseRetryAfter("0", now), 0);
    assert.equal(parseRetryAfter("86401", now), 86401);
    assert.equal(parseRetryAfter("20251231", now), 20251231);
    assert.ok(parseRetryAfter("9".repeat(20), now) > 9e18);
    assert.equal(parseRetryAfter("9".repeat(400), now), Infinity);
  });
  test("malformed values are absent", () => {
    for (const v of ["-3", "+3", "1.5", "", "  ", "soon", "7s", "0x10", "1e3", null, undefined, "Thu, 01 Jan 2026 12:00:07"]) {
      assert.equal(parseRetryAfter(v, now), undefined, JSON.stringify(v));
    }
  });
  test("HTTP-dates in all three forms are the time until them; a past date is 0", () => {
    assert.equal(parseRetryAfter("Thu, 01 Jan 2026 12:00:07 GMT", now), 7);
    assert.equal(parseRetryAfter("Thursday, 01-Jan-26 12:00:09 GMT", now), 9);
    assert.equal(parseRetryAfter("Thu Jan  1 12:00:05 2026", now), 5);
    assert.equal(parseRetryAfter("Thu, 01 Jan 2026 11:59:00 GMT", now), 0);
    assert.equal(parseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", now), 0);
  });
  test("parseHttpDate accepts only real instants in the three forms", () => {
    assert.equal(parseHttpDate("Sun, 06 Nov 1994 08:49:37 GMT"), Date.UTC(1994, 10, 6, 8, 49, 37));
    assert.equal(parseHttpDate("Sunday, 06-Nov-94 08:49:37 GMT"), Date.UTC(1994, 10, 6, 8, 49, 37));
    assert.equal(parseHttpDate("Sun Nov  6 08:49:37 1994"), Date.UTC(1994, 10, 6, 8, 49, 37));
    for (const v of ["Mon, 31 Feb 2026 00:00:00 GMT", "Mon, 01 Jan 2026 24:00:00 GMT", "2026-01-01T00:00:00Z", "-3", "1", "Mon, 1 Jan 2026 00:00:00 GMT"]) {
      assert.equal(parseHttpDate(v), undefined, v);
    }
  });
  test("a date is read against the answer's Date header when it has one", () => {
    const h = new Headers({ "retry-after": "Thu, 01 Jan 2026 12:00:07 GMT", date: "Thu, 01 Jan 2026 12:00:02 GMT" });
    assert.equal(retryAfterFromHeaders(h, 0), 5); // local clock at 1970: ignored
    const noDate = new Headers({ "retry-after": "Thu, 01 Jan 2026 12:00:07 GMT" });
    assert.equal(retryAfterFromHeaders(noDate, now), 7);
    assert.equal(retryAfterFromHeaders(new Headers(), now), undefined);
  });
});

describe("the backoff schedule of a retried call, on a fake clock", () => {
  test("with no hint it sleeps full jitter of each window and stops before the deadline", async () => {
    const srv = await serve((_req, res) => refuse(res, 503, "no_capacity"));
    try {
      const clock = fakeClock();
      const berth = new Berth({ url: srv.url, key: "k", clock, random: () => 0.5 });
      const err = await berth.sandboxes.get("sb-1").catch((e) => e);
      assert.ok(err instanceof CapacityUnavailable, String(err));

      // What SDK-1 says: wait 0.5·min(8, 0.25·2^n) s after the n-th refusal (from 0) while the
      // wait ends within 90 s of the first attempt, then give up without sleeping.
      const want = [];
      let t = 0;
      for (let n = 0; ; n++) {
        const w = 0.5 * Math.min(8, 0.25 * 2 ** n) * 1000;
        if (w > 90_000 - t) break;
        want.push(w);
        t += w;
      }
      assert.deepEqual(clock.sleeps, want);
      assert.deepEqual(clock.sleeps.slice(0, 7), [125, 250, 500, 1000, 2000, 4000, 4000]);
      assert.equal(err.attempts, want.length + 1);
      assert.equal(srv.requests.length, want.length + 1);
      assert.equal(err.elapsedS, t / 1000);
      assert.ok(clock.t - clock.start <= 90_000);
      assert.equal(err.lastCode, "no_capacity");
      assert.equal(err.retryAfterS, 0);
    } finally {
      await srv.close();
    }
  });

  test("backoff base, cap and deadline are options", async () => {
    const srv = await serve((_req, res) => refuse(res, 503, "no_capacity"));
    try {
      const clock = fakeClock();
      const berth = new Berth({ url: srv.url, key: "k", clock, random: () => 0.5, backoffBaseS: 1, backoffCapS: 2, deadlineS: 5 });
      const err = await berth.sandboxes.get("sb-1").catch((e) => e);
      assert.ok(err instanceof CapacityUnavailable, String(err));
      assert.deepEqual(clock.sleeps, [500, 1000, 1000, 1000, 1000]); // the 6th would end at 5.5 s
      assert.equal(err.attempts, 6);
    } finally {
      await srv.close();
    }
  });
});
