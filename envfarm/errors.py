"""The one exception tree of envfarm, and how each class maps to HTTP and an error kind.

    EnvfarmError
    ├── CatalogError                 a catalog folder or record cannot be read
    ├── ConfigError                  a farm setting (tenants file, API keys) is invalid
    ├── EnvNotFound                  no environment of that name            404
    ├── EnvLoadError                 an environment's code/schema/data is broken
    │   └── EnvBroken                an on-demand env that failed its first load  500
    ├── ToolCallError                a tool call did not produce a result
    │   ├── AgentError               the agent's fault: unknown tool, bad arguments, 4xx
    │   └── EnvCallError             the environment's fault: exception, 5xx, timeout
    ├── LeaseError                   lease lifecycle problems                400
    │   ├── BadRequest               body not JSON or not the schema         422
    │   │   └── MalformedJSON        hostile JSON: too deep, NaN, duplicate keys ... 400
    │   ├── PayloadTooLarge          body over the farm's size limit         413
    │   ├── TaskNotFound             the env has no such task                404
    │   ├── LeaseNotFound            no such lease                          404
    │   ├── LeaseUnauthorized        missing bearer token                   401
    │   ├── LeaseForbidden           wrong bearer token                     403
    │   ├── LeaseGone                owner replica gone, expired or closed  410
    │   ├── PoolExhausted            no instance available                  503
    │   │   ├── FarmNotReady         envs not yet routable with warm instances 503
    │   │   └── TooManyTypesLoaded   an on-demand farm at its cap of loaded types, all in use 503
    │   ├── TaskQuarantined          the task (or its env type) is out of rotation 409
    │   ├── KeyMissing               no farm API key where one is required  401
    │   ├── KeyInvalid               a farm API key the farm does not know   403
    │   └── QuotaExceeded            a tenant's quota is used up            429
    ├── VerifierError                verifier code failed; no verdict
    ├── JudgeError                   the LLM judge could not give a verdict
    ├── SynthesisError               a synthesis stage failed for good
    ├── LLMError                     an LLM endpoint is missing or failing
    └── TransportError               the farm could not be reached (client side)

Agent mistakes are observations for the agent; everything else is a farm fault that trainers
drop or retry instead of scoring.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

__all__ = [
    "HTTP_STATUS",
    "AgentError",
    "BadRequest",
    "CatalogError",
    "ConfigError",
    "ConfinementUnavailable",
    "EnvBroken",
    "EnvCallError",
    "EnvLoadError",
    "EnvNotFound",
    "EnvfarmError",
    "ErrorKind",
    "FarmNotReady",
    "JudgeError",
    "KeyInvalid",
    "KeyMissing",
    "LLMError",
    "LeaseError",
    "LeaseForbidden",
    "LeaseGone",
    "LeaseNotFound",
    "LeaseUnauthorized",
    "MalformedJSON",
    "PayloadTooLarge",
    "PoolExhausted",
    "QuotaExceeded",
    "SynthesisError",
    "TaskNotFound",
    "TaskQuarantined",
    "TooManyTypesLoaded",
    "ToolCallError",
    "TransportError",
    "VerifierError",
    "error_from_body",
    "error_type",
    "http_status",
    "status_kind",
]


class ErrorKind(str, Enum):
    """Machine-readable kind carried by every error on the wire."""

    agent_error = "agent_error"
    env_error = "env_error"
    not_found = "not_found"
    unauthorized = "unauthorized"
    forbidden = "forbidden"
    gone = "gone"
    unavailable = "unavailable"
    quarantined = "quarantined"
    rate_limited = "rate_limited"
    invalid_request = "invalid_request"
    verifier_error = "verifier_error"
    judge_error = "judge_error"
    synthesis_error = "synthesis_error"
    llm_error = "llm_error"
    transport_error = "transport_error"
    internal = "internal"


class EnvfarmError(Exception):
    """Root of every error envfarm raises on purpose."""

    kind: ErrorKind = ErrorKind.internal
    status_code: int = 500

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``{"kind", "type", "message", **fields}``; ``type`` names the class,
        so the SDK raises exactly what the server raised (``error_type``)."""
        out: dict[str, Any] = {"kind": self.kind.value, "type": type(self).__name__,
                               "message": self.message}
        out.update({k: v for k, v in self.fields.items() if _jsonable(v)})
        return out


class CatalogError(EnvfarmError):
    """A catalog folder or one of its records cannot be read."""

    kind = ErrorKind.invalid_request
    status_code = 400


class ConfigError(EnvfarmError):
    """A farm setting (a tenants file, an API key list) is invalid."""

    kind = ErrorKind.invalid_request
    status_code = 400


class EnvNotFound(EnvfarmError):
    """No environment of that name in the catalog."""

    kind = ErrorKind.not_found
    status_code = 404


class EnvLoadError(EnvfarmError):
    """An environment's code, schema or data cannot be loaded."""

    kind = ErrorKind.env_error
    status_code = 500


class EnvBroken(EnvLoadError):
    """An on-demand env type failed to load; it stays marked broken (every other type keeps
    serving) until its load is retried, after ``retry_after_s`` or once the catalog changed."""


class ToolCallError(EnvfarmError):
    """A tool call did not produce a result."""


class AgentError(ToolCallError):
    """The agent's fault: unknown tool, arguments that fail the schema, a 4xx answer."""

    kind = ErrorKind.agent_error
    status_code = 200  # an observation for the agent, not an HTTP failure


class EnvCallError(ToolCallError):
    """The environment's fault: an exception, a 5xx answer or a timeout in env code."""

    kind = ErrorKind.env_error
    status_code = 200


class LeaseError(EnvfarmError):
    """Lease lifecycle problems."""

    kind = ErrorKind.invalid_request
    status_code = 400


class BadRequest(LeaseError):
    """The request body is not valid JSON or does not match the schema."""

    kind = ErrorKind.invalid_request
    status_code = 422


class MalformedJSON(BadRequest):
    """A JSON body no route should parse: nested too deep, numbers out of range, NaN, duplicate
    keys, bytes that are not UTF-8, lone surrogates."""

    status_code = 400


class PayloadTooLarge(LeaseError):
    """The request body is over the farm's size limit."""

    kind = ErrorKind.invalid_request
    status_code = 413


class TaskNotFound(LeaseError):
    """The env has no task with that index."""

    kind = ErrorKind.not_found
    status_code = 404


class LeaseNotFound(LeaseError):
    """No lease with that id."""

    kind = ErrorKind.not_found
    status_code = 404


class LeaseUnauthorized(LeaseError):
    """The lease call carried no bearer token."""

    kind = ErrorKind.unauthorized
    status_code = 401


class LeaseForbidden(LeaseError):
    """The bearer token does not match the lease."""

    kind = ErrorKind.forbidden
    status_code = 403


class LeaseGone(LeaseError):
    """The lease existed but its state is gone (owner replica died, expired, or released)."""

    kind = ErrorKind.gone
    status_code = 410


class PoolExhausted(LeaseError):
    """No instance can be handed out right now."""

    kind = ErrorKind.unavailable
    status_code = 503


class ConfinementUnavailable(EnvfarmError):
    """The kernel cannot confine env workers, and the farm was not told to run unconfined."""

    kind = ErrorKind.unavailable
    status_code = 503
class FarmNotReady(PoolExhausted):
    """The farm is starting: not every env is routable with warm instances yet. Carries
    ``retry_after_s`` (sent as ``Retry-After``)."""


class TooManyTypesLoaded(PoolExhausted):
    """An on-demand farm holds its cap of loaded types (``max_loaded``) and every one of them
    has leases: none can be evicted to load another. Carries ``retry_after_s``."""


class TaskQuarantined(LeaseError):
    """The task, or its whole env type, is quarantined: its episodes kept failing on the env's
    side (env errors, invalid verdicts) or the catalog flagged it (a hack probe passes its
    verifier). Carries ``env``, ``task_idx`` and ``reason``; lifted by an operator
    (``envfarm envs quarantine lift``), never by waiting."""

    kind = ErrorKind.quarantined
    status_code = 409


class KeyMissing(LeaseError):
    """The farm requires an API key (``X-Envfarm-Key``) to create leases; none was sent."""

    kind = ErrorKind.unauthorized
    status_code = 401


class KeyInvalid(LeaseError):
    """The API key sent is not one of the farm's tenants."""

    kind = ErrorKind.forbidden
    status_code = 403


class QuotaExceeded(LeaseError):
    """A tenant's quota (live leases, lease creations/s, calls/s) is used up. Carries
    ``tenant``, ``quota`` and ``retry_after_s`` (sent as ``Retry-After``)."""

    kind = ErrorKind.rate_limited
    status_code = 429


class VerifierError(EnvfarmError):
    """Verifier code raised, timed out, returned garbage or tried something forbidden."""

    kind = ErrorKind.verifier_error
    status_code = 200


class JudgeError(EnvfarmError):
    """The LLM judge could not produce a parseable verdict."""

    kind = ErrorKind.judge_error
    status_code = 200


class SynthesisError(EnvfarmError):
    """A synthesis stage failed for good."""

    kind = ErrorKind.synthesis_error
    status_code = 500


class LLMError(EnvfarmError):
    """An LLM endpoint is not configured, or keeps failing."""

    kind = ErrorKind.llm_error
    status_code = 502


class TransportError(EnvfarmError):
    """The farm could not be reached, or answered something unreadable (client side)."""

    kind = ErrorKind.transport_error
    status_code = 502


def _jsonable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None), list, dict))


#: THE table from error class to HTTP status; the server answers with it and the SDK reads the
#: ``type`` of an error body back through it (``error_type``).
HTTP_STATUS: dict[type[EnvfarmError], int] = {
    cls: cls.status_code
    for cls in (
        CatalogError, ConfigError, EnvNotFound, EnvLoadError, EnvBroken, AgentError,
        EnvCallError, LeaseError, BadRequest, MalformedJSON,
        PayloadTooLarge, TaskNotFound, LeaseNotFound, LeaseUnauthorized, LeaseForbidden,
        LeaseGone, PoolExhausted, FarmNotReady, TooManyTypesLoaded, TaskQuarantined, KeyMissing,
        KeyInvalid, QuotaExceeded,
        ConfinementUnavailable, VerifierError, JudgeError, SynthesisError, LLMError,
        TransportError,
    )
}

_BY_NAME: dict[str, type[EnvfarmError]] = {cls.__name__: cls for cls in HTTP_STATUS}


def error_type(name: object, status: int, kind: object = None) -> type[EnvfarmError] | None:
    """The class an error body stands for: by its ``type`` when that names one of ours with
    this status; else by status (and kind) when the table has exactly one; else None."""
    cls = _BY_NAME.get(name) if isinstance(name, str) else None
    if cls is not None and http_status(cls) == status:
        return cls
    fits = [c for c in HTTP_STATUS if http_status(c) == status]
    if len(fits) > 1:
        fits = [c for c in fits if c.kind.value == kind]
    return fits[0] if len(fits) == 1 else None


def error_from_body(status: int, error: dict[str, Any],
                    names: dict[type[EnvfarmError], type[EnvfarmError]] | None = None
                    ) -> EnvfarmError:
    """The exception an error body (``{kind, type, message, ...}``) of ``status`` stands for.
    ``names``: a subclass to raise instead of a class (the SDK's ``LeaseLost``)."""
    kind = error.get("kind")
    message = str(error.get("message", f"HTTP {status}"))
    fields = {k: v for k, v in error.items() if k not in ("kind", "type", "message")}
    cls = error_type(error.get("type"), status, kind)
    if cls is None:
        # Not one of ours (a proxy's page, a route that does not exist): keep what it said.
        exc = EnvfarmError(message, **fields)
        if kind in ErrorKind._value2member_map_:
            exc.kind = ErrorKind(kind)
    else:
        exc = (names or {}).get(cls, cls)(message, **fields)
    exc.http_status = status  # type: ignore[attr-defined]
    return exc


def http_status(cls: type[EnvfarmError]) -> int:
    """The status of an error response: errors that are observations (2xx) answer 500 when
    they have to be raised as a whole response."""
    status = HTTP_STATUS.get(cls, cls.status_code)
    return status if status >= 400 else 500


def status_kind(status: int) -> ErrorKind:
    """The kind of an error known only by its status (a framework's own 404, 405 …): the kind
    every class of that status shares in the table, else invalid_request / internal."""
    kinds = {c.kind for c in HTTP_STATUS if http_status(c) == status}
    if len(kinds) == 1:
        return kinds.pop()
    return ErrorKind.invalid_request if status < 500 else ErrorKind.internal
