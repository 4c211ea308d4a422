// The SDK against a real `berth dev` (process runtime, 127.0.0.1, a fresh data directory)
// that this file starts and always stops: the first-sandbox path, files, lists, events, kill,
// idempotent create (API-4), apps, and tenant isolation with a tenant key (ISO-1).

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { Berth, BerthError } from "@berth/sdk";

import { startBerthDev } from "../testutil/berthdev.mjs";

describe("against a real berth dev", { timeout: 240_000 }, () => {
  let dev;
  let admin;
  before(async () => {
    dev = await startBerthDev();
    admin = new Berth({ url: dev.url, key: dev.adminKey });
  });
  after(async () => {
    await dev?.stop();
  });

  test("first sandbox: create, exec, files, get, list, events, kill", async () => {
    const sb = await admin.sandboxes.create({ template: "python", ttl_seconds: 600, metadata: { suite: "typescript" } });
    assert.match(sb.id, /^sb-/);
    assert.equal(sb.state, "running");
    assert.equal(sb.template, "python");
    assert.equal(sb.tenant, "default");
    assert.equal(sb.memory_mb, 512);
    assert.deepEqual(sb.metadata, { suite: "typescript" });
    assert.ok(!Number.isNaN(Date.parse(sb.expires_at)));

    const r = await admin.sandboxes.exec(sb.id, ["python3", "-c", "print(2+2)"]);
    assert.deepEqual(r, { exit_code: 0, stdout: "4\n", stderr: "" });
    const fail = await admin.sandboxes.exec(sb.id, { cmd: ["python3", "-c", "import sys; sys.stderr.write('no'); sys.exit(3)"], timeout_s: 30 });
    assert.deepEqual(fail, { exit_code: 3, stdout: "", stderr: "no" });

    const bytes = new Uint8Array([0, 1, 2, 255, 254, 10, 13, 0]);
    await admin.sandboxes.writeFile(sb.id, "/tmp/data/bin.dat", bytes);
    assert.deepEqual(await admin.sandboxes.readFile(sb.id, "/tmp/data/bin.dat"), bytes);
    await admin.sandboxes.writeFile(sb.id, "/tmp/hello.txt", "héllo, berth\n");
    assert.equal(await admin.sandboxes.readText(sb.id, "/tmp/hello.txt"), "héllo, berth\n");
    const cat = await admin.sandboxes.exec(sb.id, ["python3", "-c", "print(open('/tmp/hello.txt').read(), end='')"]);
    assert.equal(cat.stdout, "héllo, berth\n");

    assert.equal((await admin.sandboxes.get(sb.id)).id, sb.id);
    assert.ok((await admin.sandboxes.list()).some((s) => s.id === sb.id));
    assert.ok((await admin.sandboxes.list({ state: "running" })).some((s) => s.id === sb.id));
    assert.ok(!(await admin.sandboxes.list({ state: "stopped" })).some((s) => s.id === sb.id));

    const events = await admin.events.list({ entity: `sandbox/${sb.id}` });
    assert.ok(events.length >= 2, JSON.stringify(events));
    assert.ok(events.every((e) => e.entity === `sandbox/${sb.id}`));
    assert.ok(events.some((e) => e.to === "running"), JSON.stringify(events));

    await admin.sandboxes.kill(sb.id);
    await admin.sandboxes.kill(sb.id); // idempotent
    let state = "";
    for (let i = 0; i < 100 && state !== "stopped"; i++) {
      state = (await admin.sandboxes.get(sb.id)).state;
      if (state !== "stopped") await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(state, "stopped");
    const err = await admin.sandboxes.exec(sb.id, ["true"]).catch((e) => e);
    assert.ok(err instanceof BerthError, String(err));
    assert.equal(err.code, "conflict");
    assert.equal(err.status, 409);
  });

  test("a create with the same Idempotency-Key is the same sandbox (API-4)", async () => {
    const key = `ts-${randomBytes(8).toString("hex")}`;
    const a = await admin.sandboxes.create({ template: "python" }, { idempotencyKey: key });
    const b = await admin.sandboxes.create({ template: "python" }, { idempotencyKey: key });
    assert.equal(b.id, a.id);
    const err = await admin.sandboxes.create({ template: "python", memory_mb: 256 }, { idempotencyKey: key }).catch((e) => e);
    assert.ok(err instanceof BerthError, String(err));
    assert.equal(err.code, "idempotency_key_mismatch");
    await admin.sandboxes.kill(a.id);
  });

  test("refusals carry the server's code, status and request id", async () => {
    const missing = await admin.sandboxes.get("sb-does-not-exist").catch((e) => e);
    assert.ok(missing instanceof BerthError, String(missing));
    assert.equal(missing.code, "sandbox_not_found");
    assert.equal(missing.status, 404);
    assert.match(missing.requestId, /^req-/);
    assert.equal(missing.retryable, false);

    const tmpl = await admin.sandboxes.create({ template: "no-such-template" }).catch((e) => e);
    assert.equal(tmpl.code, "template_not_found");

    const bad = await admin.sandboxes.create({ template: "python", ttl_seconds: -1 }).catch((e) => e);
    assert.equal(bad.code, "invalid_request");
    assert.equal(bad.status, 400);

    const anon = await new Berth({ url: dev.url, key: "bk_wrong" }).sandboxes.list().catch((e) => e);
    assert.equal(anon.code, "unauthorized");
    assert.equal(anon.status, 401);
  });

  test("apps: create stopped, get, list, deploy, actions, delete", async () => {
    const name = `ts-app-${randomBytes(3).toString("hex")}`;
    const spec = { template: "python", command: ["python3", "-m", "http.server", "8080"], port: 8080 };
    const app = await admin.apps.create({ name, ...spec, desired: "stopped" });
    assert.equal(app.name, name);
    assert.equal(app.version, 1);
    assert.equal(app.desired, "stopped");
    assert.deepEqual(app.spec.command, spec.command);
    assert.equal((await admin.apps.get(name)).name, name);
    assert.ok((await admin.apps.list()).some((a) => a.name === name));
    const v2 = await admin.apps.deploy(name, { ...spec, env: { V: "2" } });
    assert.equal(v2.version, 2);
    assert.equal((await admin.apps.hibernate(name)).desired, "hibernated");
    assert.equal((await admin.apps.stop(name)).desired, "stopped");
    assert.equal((await admin.apps.setIdle(name, 300)).idle_seconds, 300);
    const events = await admin.events.list({ entity: `app/${name}` });
    assert.ok(Array.isArray(events));
    await admin.apps.delete(name);
    const gone = await admin.apps.get(name).catch((e) => e);
    assert.equal(gone.code, "app_not_found");
  });

  test("a tenant key cannot see another tenant's sandbox (404)", async () => {
    const suffix = randomBytes(3).toString("hex");
    const [ta, tb] = [`ts-a-${suffix}`, `ts-b-${suffix}`];
    assert.equal((await admin.tenants.create(ta)).name, ta);
    await admin.tenants.create(tb);
    const ka = await admin.tenants.createKey(ta);
    const kb = await admin.tenants.createKey(tb, "tenant");
    assert.equal(ka.tenant, ta);
    assert.equal(ka.role, "tenant");
    assert.ok(ka.key.length > 0);
    const alice = new Berth({ url: dev.url, key: ka.key });
    const bob = new Berth({ url: dev.url, key: kb.key });

    const sb = await alice.sandboxes.create({ template: "python" });
    assert.equal(sb.tenant, ta);
    assert.equal((await alice.sandboxes.get(sb.id)).id, sb.id);
    assert.ok((await alice.events.list({ entity: `sandbox/${sb.id}` })).length > 0);

    for (const attempt of [
      () => bob.sandboxes.get(sb.id),
      () => bob.sandboxes.exec(sb.id, ["true"]),
      () => bob.sandboxes.readFile(sb.id, "/tmp/x"),
    ]) {
      const err = await attempt().catch((e) => e);
      assert.ok(err instanceof BerthError, String(err));
      assert.equal(err.status, 404);
      assert.equal(err.code, "sandbox_not_found");
    }
    assert.ok(!(await bob.sandboxes.list()).some((s) => s.id === sb.id));
    const admins = await bob.tenants.create(`ts-c-${suffix}`).catch((e) => e);
    assert.equal(admins.code, "forbidden");
    assert.equal(admins.status, 403);

    await alice.sandboxes.kill(sb.id);
  });
});
