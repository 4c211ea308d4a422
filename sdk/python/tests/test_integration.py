"""The SDK against a real `berth dev` that this module starts (and always stops): sandboxes,
files, events, apps, templates, and tenant isolation, over real HTTP on 127.0.0.1.

The binary is $BERTH_BIN when set, else built with `go build` from the repository this file
sits in. `berth dev` runs with the process runtime (isolated as root; --insecure otherwise),
on 127.0.0.1 port 0, with its data in a temporary directory. Without a binary and without the
go command the module is skipped — a failure when CI=true.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
from pathlib import Path
from typing import Callable, Optional

import berth
from berth import Client, Conflict, NotFound, Unauthorized

REPO = Path(__file__).resolve().parents[3]
IN_CI = os.environ.get("CI", "").lower() == "true"

#: Bounds of the setup: building the binary, `berth dev` coming up, stopping it.
BUILD_TIMEOUT_S = 300
UP_TIMEOUT_S = 60
STOP_GRACE_S = 20

URL = ""
ADMIN_KEY = ""
_tmp = ""


def _set_pdeathsig() -> None:
    """In the child before exec: die with SIGKILL if the test process dies (Linux), so a
    killed test run never leaves a `berth dev` behind."""
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _skip_or_fail(why: str) -> None:
    if IN_CI:
        raise RuntimeError(why + " (CI=true: this is a failure, not a skip)")
    raise unittest.SkipTest(why)


def _berth_binary(tmp: str) -> str:
    b = os.environ.get("BERTH_BIN")
    if b:
        if not os.access(b, os.X_OK):
            raise RuntimeError(f"BERTH_BIN={b} is not an executable file")
        return b
    go = shutil.which("go")
    if go is None:
        _skip_or_fail("neither BERTH_BIN nor the go command: cannot get a berth binary")
    out = os.path.join(tmp, "berth")
    try:
        p = subprocess.run([go, "build", "-o", out, "./cmd/berth"], cwd=REPO, capture_output=True,
                           timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"go build ./cmd/berth did not end within {BUILD_TIMEOUT_S} s")
    if p.returncode != 0:
        raise RuntimeError(f"go build ./cmd/berth in {REPO}: exit {p.returncode}\n{p.stderr.decode(errors='replace')}")
    return out


def _stop(proc: "subprocess.Popen[bytes]") -> None:
    """SIGTERM (berth dev stops every sandbox it runs), SIGKILL after STOP_GRACE_S."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")
    except OSError:
        return ""


def setUpModule() -> None:
    global URL, ADMIN_KEY, _tmp
    _tmp = tempfile.mkdtemp(prefix="berth-py-sdk-")
    unittest.addModuleCleanup(shutil.rmtree, _tmp, ignore_errors=True)
    binary = _berth_binary(_tmp)
    data = os.path.join(_tmp, "data")
    out_path, err_path = os.path.join(_tmp, "dev.out"), os.path.join(_tmp, "dev.err")
    args = [binary, "dev", "--runtime", "process", "--listen", "127.0.0.1:0", "--data", data]
    if os.geteuid() != 0:
        args.append("--insecure")  # the process runtime isolates only as root
    env = dict(os.environ, HOME=_tmp)  # never the user's ~/.berth
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                preexec_fn=_set_pdeathsig)
    unittest.addModuleCleanup(_stop, proc)

    # `berth dev` prints its URL once every agent heartbeated and admin.key is written.
    deadline = time.monotonic() + UP_TIMEOUT_S
    url = ""
    while not url:
        m = re.search(r"Berth dev is up at (http://\S+)", _tail(out_path))
        if m:
            url = m.group(1)
            break
        if proc.poll() is not None:
            raise RuntimeError(f"berth dev exited with {proc.returncode} before it was up:\n{_tail(err_path)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"berth dev not up within {UP_TIMEOUT_S} s:\n{_tail(err_path)}")
        time.sleep(0.1)
    with open(os.path.join(data, "admin.key")) as f:
        key = f.read().strip()
    while True:  # /healthz answers 200: the HTTP side is serving
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}/healthz not 200 within {UP_TIMEOUT_S} s:\n{_tail(err_path)}")
        time.sleep(0.1)
    URL, ADMIN_KEY = url, key


def until(what: str, f: Callable[[], bool], within_s: float = 30, every_s: float = 0.2) -> None:
    """Poll f until it is true; fail after within_s (bounded in time and count)."""
    end = time.monotonic() + within_s
    for _ in range(int(within_s / every_s) + 1):
        if f():
            return
        if time.monotonic() > end:
            break
        time.sleep(every_s)
    raise AssertionError(f"not {what} within {within_s} s")


class Integration(unittest.TestCase):
    def setUp(self) -> None:
        self.admin = Client(URL, ADMIN_KEY, deadline_s=30)

    def sandbox(self, c: Optional[Client] = None, **kw: object) -> berth.Sandbox:
        c = c or self.admin
        sb = c.sandboxes.create("python", ttl_seconds=600, **kw)  # type: ignore[arg-type]
        self.addCleanup(c.sandboxes.delete, sb.id)
        return sb

    def test_first_sandbox(self) -> None:
        c = self.admin
        sb = self.sandbox(metadata={"job": "py-sdk"})
        self.assertRegex(sb.id, r"^sb-")
        self.assertEqual((sb.template, sb.tenant, sb.state, sb.memory_mb), ("python", "default", "running", 512))
        self.assertEqual(sb.metadata, {"job": "py-sdk"})
        self.assertIsNotNone(sb.created_at)
        self.assertGreater(sb.expires_at, sb.created_at)

        res = c.sandboxes.exec(sb.id, ["python3", "-c", "print(2+2)"])
        self.assertEqual((res.exit_code, res.stdout, res.stderr), (0, "4\n", ""))
        res = c.sandboxes.exec(sb.id, ["python3", "-c", "import sys; print(sys.stdin.read().upper())"], stdin="hi")
        self.assertEqual(res.stdout, "HI\n")
        res = c.sandboxes.exec(sb.id, ["sh", "-c", "echo oops >&2; exit 3"], timeout_s=10)
        self.assertEqual((res.exit_code, res.stderr, res.ok), (3, "oops\n", False))

        blob = bytes(range(256)) * 64 + "é\n".encode()
        c.sandboxes.write_file(sb.id, "/tmp/py-sdk/data.bin", blob)
        self.assertEqual(c.sandboxes.read_file(sb.id, "/tmp/py-sdk/data.bin"), blob)
        c.sandboxes.write_file(sb.id, "/tmp/empty", b"")
        self.assertEqual(c.sandboxes.read_file(sb.id, "/tmp/empty"), b"")
        res = c.sandboxes.exec(sb.id, ["python3", "-c", "print(len(open('/tmp/py-sdk/data.bin','rb').read()))"])
        self.assertEqual(res.stdout.strip(), str(len(blob)))

        self.assertEqual(c.sandboxes.get(sb.id).id, sb.id)
        self.assertIn(sb.id, [s.id for s in c.sandboxes.list(state="running")])
        self.assertNotIn(sb.id, [s.id for s in c.sandboxes.list(state="stopped")])

        evs = c.events.list(f"sandbox/{sb.id}")
        self.assertEqual([(e.from_, e.to) for e in evs][:2], [("pending", "starting"), ("starting", "running")])
        self.assertTrue(all(e.entity == f"sandbox/{sb.id}" and e.at is not None for e in evs))
        self.assertEqual([e.to for e in c.events.list(f"sandbox/{sb.id}", to="running", limit=1)], ["running"])

        c.sandboxes.kill(sb.id)
        c.sandboxes.kill(sb.id)  # idempotent
        until("stopped", lambda: c.sandboxes.get(sb.id).state == "stopped")
        self.assertTrue(c.sandboxes.get(sb.id).terminal)
        with self.assertRaises(Conflict):
            c.sandboxes.exec(sb.id, ["true"])
        self.assertIn("stopped", [e.to for e in c.events.list(f"sandbox/{sb.id}")])

    def test_refusals(self) -> None:
        with self.assertRaises(NotFound) as cm:
            self.admin.sandboxes.get("sb-does-not-exist")
        self.assertEqual(cm.exception.code, "sandbox_not_found")
        self.assertEqual(cm.exception.status, 404)
        self.assertRegex(cm.exception.request_id, r"^req-")
        with self.assertRaises(NotFound) as cm:
            self.admin.sandboxes.create("no-such-template")
        self.assertEqual(cm.exception.code, "template_not_found")
        with self.assertRaises(berth.InvalidRequest) as cm:
            self.admin.sandboxes.create("python", ttl_seconds=10**9)
        self.assertEqual(cm.exception.code, "invalid_request")
        with self.assertRaises(Unauthorized):
            Client(URL, "bk_not_a_key").sandboxes.list()

    def test_templates(self) -> None:
        self.assertIn("python", [t.name for t in self.admin.templates.list()])

    def test_tenant_cannot_see_another_tenants_sandbox(self) -> None:
        name = "py-sdk-" + secrets.token_hex(4)
        t = self.admin.tenants.create(name)
        self.assertEqual(t.name, name)
        k = self.admin.tenants.create_key(name, "tenant")
        self.assertEqual((k.tenant, k.role), (name, "tenant"))
        self.assertTrue(k.key)
        self.assertNotIn(k.key, repr(k))
        tenant = Client(URL, k.key, deadline_s=30)

        theirs = self.sandbox()  # the admin's, in tenant "default"
        mine = self.sandbox(tenant)
        self.assertEqual(mine.tenant, name)
        for call in (lambda: tenant.sandboxes.get(theirs.id),
                     lambda: tenant.sandboxes.exec(theirs.id, ["true"]),
                     lambda: tenant.sandboxes.read_file(theirs.id, "/etc/hostname"),
                     lambda: tenant.sandboxes.write_file(theirs.id, "/tmp/x", b"x")):
            with self.assertRaises(NotFound) as cm:
                call()
            self.assertEqual(cm.exception.code, "sandbox_not_found")
            self.assertEqual(cm.exception.status, 404)
        self.assertEqual([s.id for s in tenant.sandboxes.list()], [mine.id])
        self.assertEqual(tenant.sandboxes.get(mine.id).id, mine.id)
        self.assertEqual(self.admin.sandboxes.get(theirs.id).state, "running")  # untouched

    def test_app_lifecycle(self) -> None:
        c = self.admin
        name = "py-" + secrets.token_hex(4)
        a = c.apps.create(name, "python", ["python3", "-m", "http.server", "8080"], 8080)
        self.addCleanup(lambda: _ignore_not_found(lambda: c.apps.delete(name)))
        self.assertEqual((a.name, a.spec.template, a.spec.port, a.version, a.desired), (name, "python", 8080, 1, "running"))
        until("running", lambda: c.apps.get(name).state == "running")
        got = c.apps.get(name)
        self.assertTrue(got.sandbox_id.startswith("sb-"))
        self.assertIn(name, [x.name for x in c.apps.list()])
        self.assertEqual(c.apps.stop(name).desired, "stopped")
        until("stopped", lambda: c.apps.get(name).state == "stopped")
        self.assertIn("running", [e.to for e in c.events.list(f"app/{name}")])
        c.apps.delete(name)
        with self.assertRaises(NotFound) as cm:
            c.apps.get(name)
        self.assertEqual(cm.exception.code, "app_not_found")


def _ignore_not_found(f: Callable[[], object]) -> None:
    try:
        f()
    except NotFound:
        pass


if __name__ == "__main__":
    unittest.main()
