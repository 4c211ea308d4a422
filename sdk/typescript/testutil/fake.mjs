// A fake clock (nothing really sleeps) and a scripted HTTP server on 127.0.0.1 for the
// tests of the retry contract: the only fakes the tests use, for answers a real server
// cannot be made to give on demand (503 with a chosen Retry-After).

import { createServer } from "node:http";

/** A clock whose sleep records the wait and moves now on by it at once. */
export function fakeClock(startMs = Date.UTC(2026, 0, 1, 12, 0, 0)) {
  const c = {
    t: startMs,
    start: startMs,
    sleeps: [],
    now: () => c.t,
    sleep: async (ms, signal) => {
      if (signal?.aborted) throw signal.reason;
      c.sleeps.push(ms);
      c.t += ms;
    },
  };
  return c;
}

/**
 * Serves `handler(req, res, n, body)` on 127.0.0.1 at a port the kernel picks (n counts
 * requests from 1). Resolves to { url, requests: [{method, url, headers, body}], close() }.
 */
export async function serve(handler) {
  const requests = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      requests.push({ method: req.method, url: req.url, headers: req.headers, body });
      handler(req, res, requests.length, body);
    });
  });
  await new Promise((res) => server.listen(0, "127.0.0.1", res));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise((res) => {
        server.closeAllConnections?.();
        server.close(() => res());
      }),
  };
}

/** Writes a Berth error envelope (API-2). */
export function refuse(res, status, code, { retryAfter, retryAfterS = 0, headers = {}, requestId = "req-test" } = {}) {
  const h = { "content-type": "application/json", "x-request-id": requestId, ...headers };
  if (retryAfter !== undefined) h["retry-after"] = String(retryAfter);
  res.writeHead(status, h);
  res.end(JSON.stringify({ error: { code, message: `test ${code}`, retryable: status >= 500 || status === 429, retry_after_s: retryAfterS, request_id: requestId } }));
}

/** Writes a JSON answer. */
export function answer(res, status, body) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

/** A sandbox as the server sends it. */
export function sandboxJSON(id = "sb-1") {
  return {
    id, template: "python", tenant: "default", agent_id: "dev-agent-1", state: "running", memory_mb: 512, vcpus: 1,
    stateful: false, created_at: "2026-01-01T12:00:00Z", expires_at: "2026-01-01T13:00:00Z",
  };
}
