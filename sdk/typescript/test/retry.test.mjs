// SDK-1…3 against a scripted server on 127.0.0.1 that answers 503 (and kin) on demand, with a
// fake clock: every wait is recorded, none is slept.

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { describe, test } from "node:test";

import { Berth, BerthError, CapacityUnavailable, TransportError } from "@berth/sdk";

import { answer, fakeClock, refuse, sandboxJSON, serve } from "../testutil/fake.mjs";

/** Runs fn(srv) against a server answering with handler, and closes the server. */
async function withServer(handler, fn) {
  const srv = await serve(handler);
  try {
    await fn(srv);
  } finally {
    await srv.close();
  }
}

/** A loopback port nothing listens on. */
async function closedPort() {
  const s = createServer();
  await new Promise((res) => s.listen(0, "127.0.0.1", res));
  const { port } = s.address();
  await new Promise((res) => s.close(res));
  return port;
}

describe("a 503 with Retry-After, then success (SDK-1, SDK-3)", () => {
  test("create waits the Retry-After seconds and sends one Idempotency-Key with the first attempt's time", async () => {
    await withServer(
      (_req, res, n) => (n === 1 ? refuse(res, 503, "no_capacity", { retryAfter: 7, retryAfterS: 7 }) : answer(res, 201, sandboxJSON("sb-7"))),
      async (srv) => {
        const clock = fakeClock();
        const retries = [];
        const berth = new Berth({ url: srv.url, key: "secret", clock, random: () => 0.5, onRetry: (r) => retries.push(r) });
        const sb = await berth.sandboxes.create({ template: "python", memory_mb: 256, metadata: { a: "b" } });
        assert.equal(sb.id, "sb-7");
        assert.deepEqual(clock.sleeps, [7000]);
        assert.equal(srv.requests.length, 2);
        const [a, b] = srv.requests;
        for (const r of [a, b]) {
          assert.equal(r.method, "POST");
          assert.equal(r.url, "/v1/sandboxes");
          assert.equal(r.headers.authorization, "Bearer secret");
          assert.equal(r.headers["content-type"], "application/json");
          assert.deepEqual(JSON.parse(r.body), { template: "python", memory_mb: 256, metadata: { a: "b" } });
          assert.equal(r.headers["berth-first-attempt"], new Date(clock.start).toISOString());
        }
        assert.match(a.headers["idempotency-key"], /^[0-9a-f]{32}$/);
        assert.equal(b.headers["idempotency-key"], a.headers["idempotency-key"]);
        assert.deepEqual([a.headers["berth-attempt"], b.headers["berth-attempt"]], ["1", "2"]);
        assert.equal(retries.length, 1);
        assert.equal(retries[0].waitS, 7);
        assert.equal(retries[0].fromRetryAfter, true);
        assert.equal(retries[0].last.code, "no_capacity");
      },
    );
  });

  test("each create call gets its own key; a caller's key is sent as given", async () => {
    await withServer((_req, res) => answer(res, 201, sandboxJSON()), async (srv) => {
      const berth = new Berth({ url: srv.url, key: "k", clock: fakeClock() });
      await berth.sandboxes.create({ template: "python" });
      await berth.sandboxes.create({ template: "python" });
      await berth.sandboxes.create({ template: "python" }, { idempotencyKey: "job-42" });
      const keys = srv.requests.map((r) => r.headers["idempotency-key"]);
      assert.notEqual(keys[0], keys[1]);
      assert.equal(keys[2], "job-42");
    });
  });

  test("an HTTP-date Retry-After is read against the answer's Date header", async () => {
    await withServer(
      (_req, res, n) => {
        if (n > 1) return answer(res, 200, sandboxJSON());
        res.sendDate = false;
        refuse(res, 503, "no_capacity", {
          retryAfter: "Sun, 06 Nov 1994 08:49:42 GMT", headers: { date: "Sun, 06 Nov 1994 08:49:37 GMT" },
        });
      },
      async (srv) => {
        const clock = fakeClock(); // 2026: far from the server's 1994
        const berth = new Berth({ url: srv.url, key: "k", clock, random: () => 0.5 });
        await berth.sandboxes.get("sb-1");
        assert.deepEqual(clock.sleeps, [5000]);
      },
    );
  });

  test("without a Date header an HTTP-date is read against the client's clock (C01)", async () => {
    const clock = fakeClock();
    await withServer(
      (_req, res, n) => {
        if (n > 1) return answer(res, 200, sandboxJSON());
        res.sendDate = false;
        refuse(res, 503, "no_capacity", { retryAfter: new Date(clock.start + 4000).toUTCString() });
      },
      async (srv) => {
        const berth = new Berth({ url: srv.url, key: "k", clock, random: () => 0.5 });
        await berth.sandboxes.get("sb-1");
        assert.deepEqual(clock.sleeps, [4000]);
      },
    );
  });

  test("a past date means at once, but never twice in a row", async () => {
    await withServer(
      (_req, res, n) => {
        if (n > 2) return answer(res, 200, sandboxJSON());
        refuse(res, 503, "no_capacity", { retryAfter: "Sun, 06 Nov 1994 08:49:37 GMT" });
      },
      async (srv) => {
        const clock = fakeClock();
        const berth = new Berth({ url: srv.url, key: "k", clock, random: () => 0.5 });
        await berth.sandboxes.get("sb-1");
        assert.deepEqual(clock.sleeps, [0, 250]); // then jitter: 0.5 · 0.5 s (second window)
      },
    );
  });

  test("a malformed Retry-After falls back to full jitter (C02)", async () => {
    await withServer(
      (_req, res, n) => (n === 1 ? refuse(res, 503, "no_capacity", { retryAfter: "-3" }) : answer(res, 200, sandboxJSON())),
      async (srv) => {
        const clock = fakeClock();
        const berth = new Berth({ url: srv.url, key: "k", clock, random: () => 0.5 });
        await berth.sandboxes.get("sb-1");
        assert.deepEqual(clock.sleeps, [125]);
      },
    );
  });

  test("a proxy's 502 page is retried as unavailable", async () => {
    await withServer(
      (_req, res, n) => {
        if (n > 1) return answer(res, 200, { sandboxes: [sandboxJSON()] });
        res.writeHead(502, { "content-type": "text/html" });
        res.end("<html><body>Bad   gateway</body></html>");
      },
      async (srv) => {
        const clock = fakeClock();
        const retries = [];
        const berth = new Berth({ url: srv.url, key: "k", clock, random: () => 0.5, onRetry: (r) => retries.push(r) });
        const list = await berth.sandboxes.list({ state: "running" });
        assert.equal(list.length, 1);
        assert.equal(srv.requests[0].url, "/v1/sandboxes?state=running");
        assert.equal(retries[0].last.code, "unavailable");
        assert.equal(retries[0].last.message, "HTTP 502 Bad Gateway: <html><body>Bad gateway</body></html>");
      },
    );
  });

  test("429 rate_limited is retried after its Retry-After; another 429 is not", async () => {
    await withServer(
      (req, res, n) => {
        if (req.url.startsWith("/v1/apps")) return refuse(res, 429, "too_many_things");
        n === 1 ? refuse(res, 429, "rate_limited", { retryAfter: 2 }) : answer(res, 200, sandboxJSON());
      },
      async (srv) => {
        const clock = fakeClock();
        const berth = new Berth({ url: srv.url, key: "k", clock });
        await berth.sandboxes.get("sb-1");
        assert.deepEqual(clock.sleeps, [2000]);
        const err = await berth.apps.list().catch((e) => e);
        assert.ok(err instanceof BerthError && !(err instanceof CapacityUnavailable), String(err));
        assert.equal(err.status, 429);
        assert.equal(err.code, "too_many_things");
        assert.equal(srv.requests.length, 3);
      },
    );
  });
});

describe("out of patience: CapacityUnavailable (SDK-2)", () => {
  test("an always-503 server: retried with its Retry-After until the next wait would end past 90 s", async () => {
    await withServer(
      (_req, res) => refuse(res, 503, "no_capacity", { retryAfter: 1, retryAfterS: 1, requestId: "req-full" }),
      async (srv) => {
        const clock = fakeClock();
        const berth = new Berth({ url: srv.url, key: "k", clock });
        const err = await berth.sandboxes.create({ template: "python" }).catch((e) => e);
        assert.ok(err instanceof CapacityUnavailable, String(err));
        assert.ok(err instanceof BerthError);
        // Attempts at 0 s, 1 s, …, 90 s; the wait after the last would end at 91 s.
        assert.equal(err.attempts, 91);
        assert.equal(srv.requests.length, 91);
        assert.equal(clock.sleeps.length, 90);
        assert.ok(clock.sleeps.every((s) => s === 1000));
        assert.equal(err.elapsedS, 90);
        assert.equal(err.code, "no_capacity");
        assert.equal(err.lastCode, "no_capacity");
        assert.equal(err.retryable, true);
        assert.equal(err.retryAfterS, 1);
        assert.equal(err.status, 503);
        assert.equal(err.requestId, "req-full");
        assert.equal(err.last.code, "no_capacity");
        assert.equal(err.cause, err.last);
        assert.match(err.message, /capacity unavailable after 91 attempts in 90s \(last: no_capacity: test no_capacity; Retry-After 1s\)/);
        const keys = new Set(srv.requests.map((r) => r.headers["idempotency-key"]));
        assert.equal(keys.size, 1);
      },
    );
  });

  test("a Retry-After past the deadline gives up at once, without sleeping (C30)", async () => {
    for (const hint of ["86401", "20251231", "9".repeat(20), "9".repeat(400)]) {
      await withServer((_req, res) => refuse(res, 503, "no_capacity", { retryAfter: hint }), async (srv) => {
        const clock = fakeClock();
        const berth = new Berth({ url: srv.url, key: "k", clock });
        const err = await berth.sandboxes.create({ template: "python" }).catch((e) => e);
        assert.ok(err instanceof CapacityUnavailable, `${hint}: ${err}`);
        assert.equal(err.attempts, 1, hint);
        assert.deepEqual(clock.sleeps, [], hint);
        assert.equal(err.retryAfterS, Number(hint));
      });
    }
  });

  test("a shorter deadline is an option", async () => {
    await withServer((_req, res) => refuse(res, 503, "host_starts_saturated", { retryAfter: 3 }), async (srv) => {
      const clock = fakeClock();
      const berth = new Berth({ url: srv.url, key: "k", clock, deadlineS: 10 });
      const err = await berth.apps.get("web").catch((e) => e);
      assert.ok(err instanceof CapacityUnavailable, String(err));
      assert.deepEqual(clock.sleeps, [3000, 3000, 3000]);
      assert.equal(err.lastCode, "host_starts_saturated");
    });
  });

  test("a server that cannot be reached: retried until the deadline, then CapacityUnavailable", async () => {
    const port = await closedPort();
    const clock = fakeClock();
    const berth = new Berth({ url: `http://127.0.0.1:${port}`, key: "k", clock, random: () => 0.5, deadlineS: 5 });
    const err = await berth.sandboxes.get("sb-1").catch((e) => e);
    assert.ok(err instanceof CapacityUnavailable, String(err));
    assert.equal(err.lastCode, "unavailable");
    assert.ok(err.transportError instanceof TransportError);
    assert.equal(err.transportError.reason, "connection refused");
    assert.equal(err.status, 0);
    assert.match(err.message, /server unavailable after \d+ attempts/);
    assert.deepEqual(clock.sleeps, [125, 250, 500, 1000, 2000]);
  });
});

describe("a 429 rate_limited is retried for every call", () => {
  test("exec is sent again after the Retry-After, with the same body: nothing ran", async () => {
    await withServer(
      (_req, res, n) =>
        n === 1
          ? refuse(res, 429, "rate_limited", { retryAfter: 1, retryAfterS: 1 })
          : answer(res, 200, { exit_code: 0, stdout: "hi\n", stderr: "" }),
      async (srv) => {
        const clock = fakeClock();
        const berth = new Berth({ url: srv.url, key: "k", clock });
        const res = await berth.sandboxes.exec("sb-1", ["echo", "hi"]);
        assert.equal(res.stdout, "hi\n");
        assert.deepEqual(clock.sleeps, [1000]);
        assert.equal(srv.requests.length, 2);
        assert.deepEqual(srv.requests[0].body, srv.requests[1].body);
      },
    );
  });
});

describe("what is not retried", () => {
  test("exec is sent once: a 503 throws at once", async () => {
    await withServer((_req, res) => refuse(res, 503, "unavailable", { retryAfter: 1 }), async (srv) => {
      const clock = fakeClock();
      const berth = new Berth({ url: srv.url, key: "k", clock });
      const err = await berth.sandboxes.exec("sb-1", ["true"]).catch((e) => e);
      assert.ok(err instanceof BerthError && !(err instanceof CapacityUnavailable), String(err));
      assert.equal(err.code, "unavailable");
      assert.equal(err.status, 503);
      assert.equal(err.retryable, true);
      assert.equal(err.retryAfterS, 1);
      assert.equal(srv.requests.length, 1);
      assert.equal(srv.requests[0].headers["idempotency-key"], undefined);
      assert.deepEqual(JSON.parse(srv.requests[0].body), { cmd: ["true"] });
    });
  });

  test("an exec whose answer is lost is outcome_unknown: a hang-up after the request, a proxy's 504 page, a 200 that is no exec result", async () => {
    // The command may have run: not retryable, sent once (the Go SDK's
    // TestExecWhoseAnswerIsLostIsOutcomeUnknown). A 200 whose body is not an exec result (the
    // Go package's berth.ParseExecResult) read as exit code 0 before.
    // A byte order mark: the Go SDK refuses the body, and TextDecoder's default dropped it
    // (found by an attack). NaN is not JSON.
    const notResults = ["", "null", "{}", "[]", `{"stdout":"hi"}`, `{"exit_code":"0"}`, `{"exit_code":1.5}`,
      `\ufeff{"exit_code":0}`, `{"exit_code":0,"x":NaN}`];
    const lost = [
      (req, res) => req.socket.destroy(),
      (_req, res) => {
        res.writeHead(504, { "content-type": "text/html" });
        res.end("<html>504 Gateway Time-out</html>");
      },
      ...notResults.map((body) => (_req, res) => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(body);
      }),
    ];
    for (const handler of lost) {
      await withServer(handler, async (srv) => {
        const berth = new Berth({ url: srv.url, key: "k", clock: fakeClock() });
        const err = await berth.sandboxes.exec("sb-1", ["true"]).catch((e) => e);
        assert.ok(err instanceof BerthError && !(err instanceof CapacityUnavailable), String(err));
        assert.equal(err.code, "outcome_unknown", String(err));
        assert.equal(err.retryable, false);
        assert.match(err.message, /may have been done/);
        assert.equal(srv.requests.length, 1);
      });
    }
  });

  test("an exec result is an object whose exit_code is an integer", async () => {
    // What the Go package's berth.ParseExecResult takes, and the Python SDK's
    // ExecResult.from_answer: an integer written as a float included; output absent or null is "".
    for (const [body, want] of [
      [`{"exit_code":0,"stdout":"hi\\n","stderr":""}`, { exit_code: 0, stdout: "hi\n", stderr: "" }],
      [`{"exit_code":-1,"stdout":null}`, { exit_code: -1, stdout: "", stderr: "" }],
      [`{"exit_code":3.0,"stderr":"no"}`, { exit_code: 3, stdout: "", stderr: "no" }],
      [`{"exit_code":9007199254740991}`, { exit_code: 9007199254740991, stdout: "", stderr: "" }],
      [`{"exit_code":9007199254740992}`, undefined],
      [`{"exit_code":null}`, undefined],
      [`{"exit_code":true}`, undefined],
      [`{"exit_code":1e400}`, undefined],
      [`{"exit_code":0,"stdout":5}`, undefined],
      [`0`, undefined],
    ]) {
      const raw = (_req, res) => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(body); // as written: 3.0 and 1e400 would not survive JSON.stringify
      };
      await withServer(raw, async (srv) => {
        const berth = new Berth({ url: srv.url, key: "k", clock: fakeClock() });
        const got = await berth.sandboxes.exec("sb-1", ["true"]).catch((e) => e);
        if (want === undefined) {
          assert.ok(got instanceof BerthError && got.code === "outcome_unknown", `${body}: ${got}`);
        } else {
          assert.deepEqual(got, want, body);
        }
        assert.equal(srv.requests.length, 1);
      });
    }
  });

  test("exec on a server that cannot be reached throws a TransportError at once", async () => {
    const port = await closedPort();
    const clock = fakeClock();
    const berth = new Berth({ url: `http://127.0.0.1:${port}`, key: "k", clock });
    const err = await berth.sandboxes.exec("sb-1", { cmd: ["true"], timeout_s: 5 }).catch((e) => e);
    assert.ok(err instanceof TransportError, String(err));
    assert.equal(err.reason, "connection refused");
    assert.equal(err.method, "POST");
    assert.equal(err.path, "/v1/sandboxes/sb-1/exec");
    assert.deepEqual(clock.sleeps, []);
  });

  test("a 4xx throws at once with its code, status and request id", async () => {
    await withServer((_req, res) => refuse(res, 404, "sandbox_not_found", { requestId: "req-404" }), async (srv) => {
      const berth = new Berth({ url: srv.url, key: "k", clock: fakeClock() });
      const err = await berth.sandboxes.get("sb/../x").catch((e) => e);
      assert.ok(err instanceof BerthError, String(err));
      assert.equal(err.code, "sandbox_not_found");
      assert.equal(err.status, 404);
      assert.equal(err.requestId, "req-404");
      assert.equal(err.retryable, false);
      assert.equal(err.message, "test sandbox_not_found");
      assert.equal(srv.requests.length, 1);
      assert.equal(srv.requests[0].url, "/v1/sandboxes/sb%2F..%2Fx");
    });
  });
});

describe("transport failures of a retried call", () => {
  test("a server that hangs up before answering is retried", async () => {
    await withServer(
      (req, res, n) => (n === 1 ? req.socket.destroy() : answer(res, 200, sandboxJSON())),
      async (srv) => {
        const clock = fakeClock();
        const berth = new Berth({ url: srv.url, key: "k", clock, random: () => 0.5 });
        const sb = await berth.sandboxes.get("sb-1");
        assert.equal(sb.id, "sb-1");
        assert.equal(srv.requests.length, 2);
        assert.deepEqual(clock.sleeps, [125]);
      },
    );
  });

  test("an attempt that outlives its own bound is cut and retried (C28)", async () => {
    await withServer(
      (_req, res, n) => {
        if (n > 1) answer(res, 200, sandboxJSON());
        // the first request is never answered
      },
      async (srv) => {
        const clock = fakeClock();
        const retries = [];
        const berth = new Berth({ url: srv.url, key: "k", clock, random: () => 0.5, attemptTimeoutS: 0.2, onRetry: (r) => retries.push(r) });
        const sb = await berth.sandboxes.get("sb-1");
        assert.equal(sb.id, "sb-1");
        assert.equal(retries.length, 1);
        assert.equal(retries[0].transportError.reason, "timed out after 0.2s");
      },
    );
  });

  test("aborting the call's signal stops it while it waits to retry", async () => {
    await withServer((_req, res) => refuse(res, 503, "no_capacity", { retryAfter: 1 }), async (srv) => {
      const ac = new AbortController();
      const clock = fakeClock();
      const berth = new Berth({ url: srv.url, key: "k", clock, onRetry: (r) => r.attempt === 3 && ac.abort() });
      const err = await berth.sandboxes.get("sb-1", { signal: ac.signal }).catch((e) => e);
      assert.equal(err.name, "AbortError");
      assert.equal(srv.requests.length, 3);
    });
  });
});

describe("files, kill, apps and events on the wire", () => {
  test("bytes and strings go as raw bodies; paths as a query", async () => {
    await withServer(
      (req, res) => {
        if (req.method === "PUT") {
          res.writeHead(204);
          return res.end();
        }
        if (req.method === "DELETE") {
          res.writeHead(204);
          return res.end();
        }
        res.writeHead(200, { "content-type": "application/octet-stream" });
        res.end(Buffer.from([0, 255, 10, 13]));
      },
      async (srv) => {
        const berth = new Berth({ url: srv.url, key: "k", clock: fakeClock() });
        await berth.sandboxes.writeFile("sb-1", "/tmp/a b.txt", "héllo");
        await berth.sandboxes.writeFile("sb-1", "/tmp/x.bin", new Uint8Array([1, 2, 3]));
        assert.deepEqual(await berth.sandboxes.readFile("sb-1", "/tmp/x.bin"), new Uint8Array([0, 255, 10, 13]));
        await berth.sandboxes.kill("sb-1");
        const [w1, w2, r1, k] = srv.requests;
        assert.equal(w1.url, "/v1/sandboxes/sb-1/files?path=%2Ftmp%2Fa+b.txt");
        assert.deepEqual(w1.body, Buffer.from("héllo", "utf8"));
        assert.equal(w1.headers["content-type"], "application/octet-stream");
        assert.deepEqual(w2.body, Buffer.from([1, 2, 3]));
        assert.equal(r1.method, "GET");
        assert.equal(k.method, "DELETE");
        assert.equal(k.url, "/v1/sandboxes/sb-1");
      },
    );
  });

  test("events filters become the query", async () => {
    await withServer((_req, res) => answer(res, 200, { events: [] }), async (srv) => {
      const berth = new Berth({ url: srv.url, key: "k", clock: fakeClock() });
      assert.deepEqual(await berth.events.list({ entity: "sandbox/sb-1", since: new Date(Date.UTC(2026, 0, 1)), limit: 5 }), []);
      assert.equal(srv.requests[0].url, "/v1/events?entity=sandbox%2Fsb-1&since=2026-01-01T00%3A00%3A00.000Z&limit=5");
    });
  });

  test("app create and deploy carry an Idempotency-Key; actions do not", async () => {
    await withServer((_req, res) => answer(res, 201, { name: "web" }), async (srv) => {
      const berth = new Berth({ url: srv.url, key: "k", clock: fakeClock() });
      const spec = { template: "python", command: ["python3", "-m", "http.server", "8080"], port: 8080 };
      await berth.apps.create({ name: "web", ...spec, desired: "stopped" });
      await berth.apps.deploy("web", spec);
      await berth.apps.hibernate("web");
      const [c, d, h] = srv.requests;
      assert.match(c.headers["idempotency-key"], /^[0-9a-f]{32}$/);
      assert.match(d.headers["idempotency-key"], /^[0-9a-f]{32}$/);
      assert.notEqual(c.headers["idempotency-key"], d.headers["idempotency-key"]);
      assert.equal(h.headers["idempotency-key"], undefined);
      assert.equal(d.url, "/v1/apps/web/deploy");
      assert.equal(h.url, "/v1/apps/web/hibernate");
    });
  });
});

describe("configuration", () => {
  test("BERTH_URL and BERTH_KEY are the defaults; options win", async () => {
    await withServer((_req, res) => answer(res, 200, { apps: [] }), async (srv) => {
      const saved = { url: process.env.BERTH_URL, key: process.env.BERTH_KEY };
      try {
        process.env.BERTH_URL = srv.url + "/";
        process.env.BERTH_KEY = "from-env";
        const a = new Berth({ clock: fakeClock() });
        assert.equal(a.url, srv.url);
        await a.apps.list();
        await new Berth({ key: "from-option" }).apps.list();
        delete process.env.BERTH_URL;
        assert.equal(new Berth().url, "http://127.0.0.1:7070");
      } finally {
        for (const [k, v] of [["BERTH_URL", saved.url], ["BERTH_KEY", saved.key]]) {
          if (v === undefined) delete process.env[k];
          else process.env[k] = v;
        }
      }
      assert.deepEqual(srv.requests.map((r) => r.headers.authorization), ["Bearer from-env", "Bearer from-option"]);
      assert.equal(srv.requests[0].headers["user-agent"], "berth-typescript-client/1");
    });
  });

  test("a URL that is not http(s) is refused at construction", () => {
    for (const url of ["ftp://x", "not a url", "127.0.0.1:7070"]) {
      assert.throws(() => new Berth({ url }), (e) => e instanceof BerthError && e.code === "invalid_request", url);
    }
  });
});
