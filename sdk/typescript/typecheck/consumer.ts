// Compiled (never run) by `npm run typecheck`: the published declarations (dist/*.d.ts),
// reached by the package's own name as a user reaches them, must type the README's
// snippet and the error handling a user writes. A declaration that drifts fails the build.

import { Berth, BerthError, CapacityUnavailable, TransportError } from "@berth/sdk";
import type { App, Event, ExecResult, Sandbox, SandboxState } from "@berth/sdk";

export async function firstSandbox(): Promise<string> {
  const berth = new Berth(); // BERTH_URL, BERTH_KEY
  const sb = await berth.sandboxes.create({ template: "python" });
  const r = await berth.sandboxes.exec(sb.id, ["python3", "-c", "print(2+2)"]);
  await berth.sandboxes.kill(sb.id);
  return r.stdout; // "4\n"
}

export async function handling(berth: Berth): Promise<void> {
  try {
    const sb: Sandbox = await berth.sandboxes.create(
      { template: "python", memory_mb: 1024, ttl_seconds: 600, stateful: false, metadata: { job: "42" } },
      { idempotencyKey: "job-42" },
    );
    const state: SandboxState = sb.state;
    const res: ExecResult = await berth.sandboxes.exec(sb.id, { cmd: ["ls"], timeout_s: 10 });
    await berth.sandboxes.writeFile(sb.id, "/tmp/a", new Uint8Array([1]));
    await berth.sandboxes.writeFile(sb.id, "/tmp/b", "text");
    const bytes: Uint8Array = await berth.sandboxes.readFile(sb.id, "/tmp/a");
    const text: string = await berth.sandboxes.readText(sb.id, "/tmp/b");
    const running: Sandbox[] = await berth.sandboxes.list({ state: "running" });
    const events: Event[] = await berth.events.list({ entity: `sandbox/${sb.id}` });
    const apps: App[] = await berth.apps.list();
    void [state, res.exit_code, bytes, text, running, events, apps];
  } catch (e) {
    if (e instanceof CapacityUnavailable) {
      const parked: [string, number, number, number] = [e.lastCode, e.attempts, e.elapsedS, e.retryAfterS];
      void parked;
    } else if (e instanceof BerthError) {
      const fields: [string, string, boolean, number, string, number] = [e.code, e.message, e.retryable, e.retryAfterS, e.requestId, e.status];
      void fields;
    } else if (e instanceof TransportError) {
      const why: string = e.reason;
      void why;
    }
  }
}

export const tested = new Berth({
  url: "http://127.0.0.1:7070",
  key: "k",
  deadlineS: 30,
  clock: { now: () => 0, sleep: async () => {} },
  random: () => 0.5,
  onRetry: (r) => void r.waitS,
});
