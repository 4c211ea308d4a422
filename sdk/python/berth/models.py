"""The objects of the Berth v1 API as dataclasses, decoded from the JSON the server sends
(docs/API.md; the Go types in sandbox.go, app.go, event.go, tenant.go).

Every object keeps the JSON it was decoded from in ``raw`` (not shown by repr, not compared),
so a field a newer server adds is still readable. Times are timezone-aware UTC datetimes;
a time the server omits (or Go's zero time) is None.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

# Sandbox states (LIF-1, PAUSE-1, SPOT-3).
PENDING = "pending"
STARTING = "starting"
RUNNING = "running"
STOPPING = "stopping"
STOPPED = "stopped"
FAILED = "failed"
LOST = "lost"
EVICTED = "evicted"
EVACUATING = "evacuating"
RECONSTRUCTED = "reconstructed"
MIGRATED = "migrated"
PAUSING = "pausing"
PAUSED = "paused"
RESUMING = "resuming"
SNAPSHOTTING = "snapshotting"

#: States no transition leaves.
TERMINAL_STATES = frozenset({STOPPED, FAILED, LOST, EVICTED, RECONSTRUCTED, MIGRATED})

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$")


def parse_time(v: Any) -> Optional[_dt.datetime]:
    """Parse an RFC 3339 time as Go writes it (any number of fractional digits, "Z" or an
    offset) into an aware datetime in UTC; None for None, "", Go's zero time
    (0001-01-01T00:00:00Z) or a string that is not RFC 3339. Works on Python 3.9, whose
    fromisoformat takes neither "Z" nor nanoseconds."""
    if not isinstance(v, str) or not v:
        return None
    m = _RFC3339.match(v)
    if not m:
        return None
    y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
    frac = (m.group(7) or "")[:6].ljust(6, "0")
    if m.group(8):
        tz = _dt.timezone.utc
    else:
        off = _dt.timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        tz = _dt.timezone(off if m.group(9) == "+" else -off)
    try:
        t = _dt.datetime(y, mo, d, h, mi, s, int(frac), tzinfo=tz)
    except ValueError:
        return None
    if y == 1 and mo == 1 and d == 1 and h == 0 and mi == 0 and s == 0 and frac == "000000":
        return None  # Go's zero time: "never set"
    return t.astimezone(_dt.timezone.utc)


def _str(d: Mapping[str, Any], k: str) -> str:
    v = d.get(k)
    return v if isinstance(v, str) else ""


def _int(d: Mapping[str, Any], k: str) -> int:
    v = d.get(k)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _bool(d: Mapping[str, Any], k: str) -> bool:
    return d.get(k) is True


def _strmap(d: Mapping[str, Any], k: str) -> Dict[str, str]:
    v = d.get(k)
    return {str(a): str(b) for a, b in v.items()} if isinstance(v, dict) else {}


def _strlist(d: Mapping[str, Any], k: str) -> List[str]:
    v = d.get(k)
    return [str(x) for x in v] if isinstance(v, list) else []


@dataclass
class Sandbox:
    """One sandbox (docs/API.md "Sandbox object"). ``memory_mb`` is its configured size in
    MiB; ``agent_id`` the host it runs on ("" while paused); ``reason`` explains the latest
    transition; ``expires_at`` is when its TTL stops it."""

    id: str
    template: str
    tenant: str
    agent_id: str
    state: str
    memory_mb: int
    vcpus: int
    stateful: bool
    created_at: Optional[_dt.datetime]
    expires_at: Optional[_dt.datetime]
    metadata: Dict[str, str] = field(default_factory=dict)
    reason: str = ""
    volume: str = ""
    paused_at: Optional[_dt.datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def terminal(self) -> bool:
        """Whether no further transition leaves the sandbox's state."""
        return self.state in TERMINAL_STATES

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Sandbox":
        return cls(
            id=_str(d, "id"), template=_str(d, "template"), tenant=_str(d, "tenant"),
            agent_id=_str(d, "agent_id"), state=_str(d, "state"), memory_mb=_int(d, "memory_mb"),
            vcpus=_int(d, "vcpus"), stateful=_bool(d, "stateful"),
            created_at=parse_time(d.get("created_at")), expires_at=parse_time(d.get("expires_at")),
            metadata=_strmap(d, "metadata"), reason=_str(d, "reason"), volume=_str(d, "volume"),
            paused_at=parse_time(d.get("paused_at")), raw=dict(d),
        )


@dataclass
class ExecResult:
    """The answer of an exec: the exit code (−1 when the command timed out) and its captured
    output, each stream capped at 1 MiB by the server. A non-zero exit code is a result, not
    an error."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """Whether the command exited 0."""
        return self.exit_code == 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ExecResult":
        return cls(exit_code=_int(d, "exit_code"), stdout=_str(d, "stdout"), stderr=_str(d, "stderr"))

    @classmethod
    def from_answer(cls, d: Any) -> Optional["ExecResult"]:
        """The ExecResult in ``d``, an exec's 2xx body decoded from JSON, or None when it is not
        one (the Go package's ``berth.ParseExecResult``): an exec result is an object whose
        ``exit_code`` is a number with an integer value (1 and 1.0 alike) of magnitude at most
        MAX_EXEC_EXIT_CODE, and whose ``stdout`` and ``stderr``, when present and not null, are
        strings. Anything else — None, {}, [], {"stdout": "x"}, {"exit_code": "0"},
        {"exit_code": 1.5} — once read as exit code 0, when what the command did is unknown;
        the client raises outcome_unknown for it."""
        if not isinstance(d, dict):
            return None
        code = d.get("exit_code")
        if isinstance(code, bool) or not isinstance(code, (int, float)):
            return None
        if isinstance(code, float) and not code.is_integer():  # 1.5, inf and nan
            return None
        if abs(code) > MAX_EXEC_EXIT_CODE:
            return None
        if any(d.get(k) is not None and not isinstance(d.get(k), str) for k in ("stdout", "stderr")):
            return None
        return cls(exit_code=int(code), stdout=_str(d, "stdout"), stderr=_str(d, "stderr"))


#: The largest magnitude of an exec result's exit_code, 2**53 − 1: the largest integer every
#: SDK's numbers hold exactly (a JavaScript number's), so the SDKs agree on what an exec result
#: is (the Go package's MaxExecExitCode).
MAX_EXEC_EXIT_CODE = 2**53 - 1


@dataclass
class AppSpec:
    """One version of an app (APP-1): the template its sandbox starts from, the command of its
    long-lived HTTP server, the TCP port it listens on inside the sandbox, and optionally its
    memory in MiB, files written before the command starts (path relative to the sandbox's
    working directory → content) and environment."""

    template: str
    command: List[str]
    port: int
    memory_mb: int = 0
    files: Dict[str, str] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"template": self.template, "command": list(self.command), "port": self.port}
        if self.memory_mb:
            out["memory_mb"] = self.memory_mb
        if self.files:
            out["files"] = dict(self.files)
        if self.env:
            out["env"] = dict(self.env)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "AppSpec":
        return cls(template=_str(d, "template"), command=_strlist(d, "command"), port=_int(d, "port"),
                   memory_mb=_int(d, "memory_mb"), files=_strmap(d, "files"), env=_strmap(d, "env"))


@dataclass
class App:
    """One app (docs/API.md "App object"). ``state`` is what it is (deploying, waking,
    running, waiting_capacity, hibernated, stopped, error), ``desired`` what its owner wants
    (running, hibernated, stopped); ``version`` counts deploys; ``sandbox_id`` serves it."""

    name: str
    tenant: str
    spec: AppSpec
    version: int
    desired: str
    state: str
    reason: str = ""
    sandbox_id: str = ""
    agent_id: str = ""
    serving_version: int = 0
    paused_sandbox: str = ""
    paused_version: int = 0
    retire: List[str] = field(default_factory=list)
    retire_at: Optional[_dt.datetime] = None
    incarnation: int = 0
    waiting_since: Optional[_dt.datetime] = None
    retry_at: Optional[_dt.datetime] = None
    retry_code: str = ""
    attempts: int = 0
    start_failures: int = 0
    idle_seconds: int = 0
    last_active: Optional[_dt.datetime] = None
    revision: int = 0
    created_at: Optional[_dt.datetime] = None
    updated_at: Optional[_dt.datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "App":
        spec = d.get("spec")
        return cls(
            name=_str(d, "name"), tenant=_str(d, "tenant"),
            spec=AppSpec.from_json(spec if isinstance(spec, dict) else {}),
            version=_int(d, "version"), desired=_str(d, "desired"), state=_str(d, "state"),
            reason=_str(d, "reason"), sandbox_id=_str(d, "sandbox_id"), agent_id=_str(d, "agent_id"),
            serving_version=_int(d, "serving_version"), paused_sandbox=_str(d, "paused_sandbox"),
            paused_version=_int(d, "paused_version"), retire=_strlist(d, "retire"),
            retire_at=parse_time(d.get("retire_at")), incarnation=_int(d, "incarnation"),
            waiting_since=parse_time(d.get("waiting_since")), retry_at=parse_time(d.get("retry_at")),
            retry_code=_str(d, "retry_code"), attempts=_int(d, "attempts"),
            start_failures=_int(d, "start_failures"), idle_seconds=_int(d, "idle_seconds"),
            last_active=parse_time(d.get("last_active")), revision=_int(d, "revision"),
            created_at=parse_time(d.get("created_at")), updated_at=parse_time(d.get("updated_at")),
            raw=dict(d),
        )


@dataclass
class Event:
    """One recorded state transition (LIF-3): ``entity`` is "<kind>/<id>" ("sandbox/sb-1",
    "app/web", "agent/a1"); ``from_`` and ``to`` the states ("" from for a creation);
    ``actor`` who caused it ("tenant/acme", "admin/default" for an admin key, "agent/a1", …)."""

    id: int
    at: Optional[_dt.datetime]
    entity: str
    from_: str
    to: str
    reason: str
    actor: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Event":
        return cls(id=_int(d, "id"), at=parse_time(d.get("at")), entity=_str(d, "entity"),
                   from_=_str(d, "from"), to=_str(d, "to"), reason=_str(d, "reason"),
                   actor=_str(d, "actor"), raw=dict(d))


@dataclass
class Template:
    """A template sandboxes are created from, with its baked memory in MiB and vCPUs."""

    name: str
    memory_mb: int
    vcpus: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Template":
        return cls(name=_str(d, "name"), memory_mb=_int(d, "memory_mb"), vcpus=_int(d, "vcpus"))


@dataclass
class Tenant:
    """A tenant (admin API)."""

    name: str
    created_at: Optional[_dt.datetime]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Tenant":
        return cls(name=_str(d, "name"), created_at=parse_time(d.get("created_at")))


@dataclass
class APIKeySecret:
    """A newly minted API key. ``key`` is the secret itself: the server keeps only its hash
    (API-1), so this is the only time it is ever shown."""

    id: str
    tenant: str
    role: str
    key: str = field(repr=False)
    created_at: Optional[_dt.datetime] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "APIKeySecret":
        return cls(id=_str(d, "id"), tenant=_str(d, "tenant"), role=_str(d, "role"), key=_str(d, "key"),
                   created_at=parse_time(d.get("created_at")))


@dataclass
class Retry:
    """A retry the client is about to wait for, given to ``on_retry``: the attempt that was
    refused (from 1), the wait in seconds, whether it is the server's Retry-After (else full
    jitter), and the refusal (code "unavailable" with ``transport_error`` set when the attempt
    got no answer)."""

    attempt: int
    wait_s: float
    from_retry_after: bool
    last: Any  # BerthError
    transport_error: Any = None  # Optional[TransportError]
