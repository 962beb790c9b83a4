"""Wire errors back to the one exception tree, in one table (the server's, read backwards)."""

from __future__ import annotations

import json
from typing import Any

from envfarm.errors import (
    AgentError,
    CatalogError,
    EnvCallError,
    EnvfarmError,
    EnvNotFound,
    ErrorKind,
    LeaseError,
    LeaseForbidden,
    LeaseGone,
    LeaseNotFound,
    LeaseUnauthorized,
    PoolExhausted,
    TransportError,
)
from envfarm.farm._errors import BadRequest, PayloadTooLarge, TaskNotFound


class LeaseLost(LeaseGone):
    """410: the lease's state is gone (owner replica died, expired, reaped or released)."""


#: The SDK's name for an env-side tool failure.
EnvError = EnvCallError

_BY_STATUS_KIND: dict[tuple[int, str], type[EnvfarmError]] = {
    (401, ErrorKind.unauthorized.value): LeaseUnauthorized,
    (403, ErrorKind.forbidden.value): LeaseForbidden,
    (410, ErrorKind.gone.value): LeaseLost,
    (413, ErrorKind.invalid_request.value): PayloadTooLarge,
    (422, ErrorKind.invalid_request.value): BadRequest,
    (400, ErrorKind.invalid_request.value): CatalogError,
    (503, ErrorKind.unavailable.value): PoolExhausted,
}
_BY_STATUS: dict[int, type[EnvfarmError]] = {
    401: LeaseUnauthorized, 403: LeaseForbidden, 410: LeaseLost, 413: PayloadTooLarge,
    422: BadRequest, 503: PoolExhausted, 400: LeaseError,
}
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
    kind = str(error.get("kind", ""))
    message = str(error.get("message", f"HTTP {status}"))
    fields: dict[str, Any] = {k: v for k, v in error.items() if k not in ("kind", "message")}
    cls = _BY_STATUS_KIND.get((status, kind))
    if cls is None and status == 404:
        cls = _not_found(message, fields)
    cls = cls or _BY_STATUS.get(status) or TransportError
    exc = cls(message, **fields)
    exc.http_status = status  # type: ignore[attr-defined]
    return exc


def _not_found(message: str, fields: dict[str, Any]) -> type[EnvfarmError]:
    if "lease_id" in fields:
        return LeaseNotFound
    if "task_idx" in fields:
        return TaskNotFound
    return EnvNotFound


def call_error(kind: str, message: str, **fields: Any) -> EnvfarmError:
    """The exception of a failed tool call (``{ok: false, error: {kind, message}}``)."""
    return _CALL_KINDS.get(kind, EnvError)(message, **fields)
