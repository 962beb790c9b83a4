"""Wire errors back to the one exception tree: the body's ``type`` read through the table the
server answers with (``envfarm.errors.HTTP_STATUS``)."""

from __future__ import annotations

import json
from typing import Any

from envfarm.errors import (
    AgentError,
    EnvCallError,
    EnvfarmError,
    LeaseGone,
    TransportError,
    error_from_body,
)


class LeaseLost(LeaseGone):
    """410: the lease's state is gone (owner replica died, expired, reaped or released)."""


#: The SDK's name for an env-side tool failure.
EnvError = EnvCallError

#: Where the SDK raises a subclass with a name for callers (same status, same kind).
SDK_NAMES: dict[type[EnvfarmError], type[EnvfarmError]] = {LeaseGone: LeaseLost}
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
    return error_from_body(status, error, SDK_NAMES)


def call_error(kind: str, message: str, **fields: Any) -> EnvfarmError:
    """The exception of a failed tool call (``{ok: false, error: {kind, message}}``)."""
    return _CALL_KINDS.get(kind, EnvError)(message, **fields)
