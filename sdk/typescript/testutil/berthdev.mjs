// Starts a real `berth dev` for the integration tests: the binary from BERTH_BIN, or built
// from this repository with `go build`; the process runtime (isolated as root, --insecure
// otherwise); a fresh data directory; a port the kernel picks on 127.0.0.1. stop() always
// ends it: SIGTERM, then SIGKILL after 20 s; a process exit kills it too.

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
/** The repository root (sdk/typescript/testutil → ../../..). */
export const repoRoot = resolve(here, "..", "..", "..");

const STOP_GRACE_MS = 20_000;
const START_BOUND_MS = 120_000;

/** The berth binary: BERTH_BIN, else one built from the repository into a temporary directory. */
export function berthBinary() {
  if (process.env.BERTH_BIN) return process.env.BERTH_BIN;
  const dir = mkdtempSync(join(tmpdir(), "berth-ts-bin-"));
  const bin = join(dir, "berth");
  execFileSync("go", ["build", "-o", bin, "./cmd/berth"], { cwd: repoRoot, stdio: ["ignore", "inherit", "inherit"], timeout: 600_000 });
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  return bin;
}

/**
 * Starts `berth dev` and resolves once it said it is up, /healthz answers and admin.key is
 * there: { url, adminKey, dataDir, output(), stop() }. Rejects (after stopping it) when it
 * exits first or is not up within START_BOUND_MS.
 */
export async function startBerthDev(bin = berthBinary()) {
  const dataDir = mkdtempSync(join(tmpdir(), "berth-ts-dev-"));
  const args = ["dev", "--runtime", "process", "--listen", "127.0.0.1:0", "--data", dataDir];
  if (typeof process.getuid === "function" && process.getuid() !== 0) args.push("--insecure");
  const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (b) => (out += b));
  child.stderr.on("data", (b) => (out += b));
  const exited = new Promise((res) => child.once("exit", (code, signal) => res({ code, signal })));
  let done = false;
  child.once("exit", () => (done = true));
  const killOnExit = () => {
    if (!done) child.kill("SIGKILL");
  };
  process.on("exit", killOnExit);

  const stop = async () => {
    if (!done) {
      child.kill("SIGTERM");
      let timer;
      const grace = new Promise((res) => (timer = setTimeout(res, STOP_GRACE_MS, "timeout")));
      if ((await Promise.race([exited, grace])) === "timeout") {
        child.kill("SIGKILL");
        await exited;
      }
      clearTimeout(timer);
    }
    process.off("exit", killOnExit);
    rmSync(dataDir, { recursive: true, force: true });
  };

  try {
    const until = Date.now() + START_BOUND_MS;
    let url;
    for (let i = 0; ; i++) {
      if (done) throw new Error(`berth dev exited before it was up: ${JSON.stringify(await exited)}\n${out}`);
      if (Date.now() > until || i > START_BOUND_MS / 100) throw new Error(`berth dev not up within ${START_BOUND_MS} ms:\n${out}`);
      const m = /Berth dev is up at (http:\/\/\S+)/.exec(out);
      if (m) {
        url ??= m[1];
        const ok = await fetch(`${url}/healthz`).then((r) => r.ok, () => false);
        if (ok) break;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    const adminKey = readFileSync(join(dataDir, "admin.key"), "utf8").trim();
    return { url, adminKey, dataDir, output: () => out, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
