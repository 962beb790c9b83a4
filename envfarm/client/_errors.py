"""Wire errors back to the one exception tree: the body's ``type`` read through the table the
server answers with (``envfarm.errors.HTTP_STATUS``)."""

from __future__ import annotations

import json
from typing import Any

from envfarm.errors import (
    AgentError,
    EnvCallError,
    EnvfarmError,
    ErrorKind,
    LeaseGone,
    TransportError,
    error_type,
)


class LeaseLost(LeaseGone):
    """410: the lease's state is gone (owner replica died, expired, reaped or released)."""


#: The SDK's name for an env-side tool failure.
EnvError = EnvCallError

#: Where the SDK raises a subclass with a name for callers (same status, same kind).
_SDK_NAMES: dict[type[EnvfarmError], type[EnvfarmError]] = {LeaseGone: LeaseLost}
_CALL_KINDS: dict[str, type[EnvfarmError]] = {"agent_error": AgentError, "env_error": EnvError}


def error_from_wire(status: int, body: bytes) -> EnvfarmError:
    """The exception a non-2xx reply stands for."""
    try:
        payload = json.loads(body)
        error = payload["error"] if isinstance(payload, dict) else None
    except (ValueError, KeyError):
        error = None
    if not isinstance(error, dict):
        text = body[:300].decode(errors="replace")
        return TransportError(f"farm answered HTTP {status}: {text}", status=status)
    kind = error.get("kind")
    message = str(error.get("message", f"HTTP {status}"))
    fields: dict[str, Any] = {k: v for k, v in error.items()
                              if k not in ("kind", "type", "message")}
    cls = error_type(error.get("type"), status, kind)
    if cls is None:
        # Not one of ours (a proxy's page, a route that does not exist): keep what it said.
        exc = EnvfarmError(message, **fields)
        if kind in ErrorKind._value2member_map_:
            exc.kind = ErrorKind(kind)
    else:
        exc = _SDK_NAMES.get(cls, cls)(message, **fields)
    exc.http_status = status  # type: ignore[attr-defined]
    return exc


def call_error(kind: str, message: str, **fields: Any) -> EnvfarmError:
    """The exception of a failed tool call (``{ok: false, error: {kind, message}}``)."""
    return _CALL_KINDS.get(kind, EnvError)(message, **fields)
