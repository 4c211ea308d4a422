"""Berth's Python SDK: sandboxes, apps and events over the Berth v1 HTTP API, with the Go SDK's
retry contract (SDK-1…3). Standard library only.

    from berth import Client
    client = Client()  # $BERTH_URL (default http://127.0.0.1:7070) and $BERTH_KEY
    sb = client.sandboxes.create("python")
    print(client.sandboxes.exec(sb.id, ["python3", "-c", "print(2+2)"]).stdout)
    client.sandboxes.kill(sb.id)
"""

from .client import DEFAULT_DEADLINE_S, DEFAULT_URL, DEFAULT_USER_AGENT, Apps, Client, Events, Sandboxes, Templates, Tenants
from .errors import (
    BerthError, CapacityUnavailable, Conflict, Forbidden, InternalError, InvalidRequest, NotFound,
    RetryableError, TransportError, Unauthorized,
)
from .models import APIKeySecret, App, AppSpec, Event, ExecResult, Retry, Sandbox, Template, Tenant

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandboxes", "Apps", "Events", "Templates", "Tenants",
    "DEFAULT_URL", "DEFAULT_DEADLINE_S", "DEFAULT_USER_AGENT",
    "BerthError", "CapacityUnavailable", "Conflict", "Forbidden", "InternalError", "InvalidRequest",
    "NotFound", "RetryableError", "TransportError", "Unauthorized",
    "APIKeySecret", "App", "AppSpec", "Event", "ExecResult", "Retry", "Sandbox", "Template", "Tenant",
]
