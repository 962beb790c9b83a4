"""The one exception tree of envfarm, and how each class maps to HTTP and an error kind.

    EnvfarmError
    ├── CatalogError                 a catalog folder or record cannot be read
    ├── EnvNotFound                  no environment of that name            404
    ├── EnvLoadError                 an environment's code/schema/data is broken
    ├── ToolCallError                a tool call did not produce a result
    │   ├── AgentError               the agent's fault: unknown tool, bad arguments, 4xx
    │   └── EnvCallError             the environment's fault: exception, 5xx, timeout
    ├── LeaseError                   lease lifecycle problems
    │   ├── LeaseNotFound            no such lease                          404
    │   ├── LeaseUnauthorized        missing bearer token                   401
    │   ├── LeaseForbidden           wrong bearer token                     403
    │   ├── LeaseGone                owner replica gone, expired or closed  410
    │   └── PoolExhausted            no instance available                  503
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


class ErrorKind(str, Enum):
    """Machine-readable kind carried by every error on the wire."""

    agent_error = "agent_error"
    env_error = "env_error"
    not_found = "not_found"
    unauthorized = "unauthorized"
    forbidden = "forbidden"
    gone = "gone"
    unavailable = "unavailable"
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
        """The wire form: ``{"kind", "message", **fields}``."""
        out: dict[str, Any] = {"kind": self.kind.value, "message": self.message}
        out.update({k: v for k, v in self.fields.items() if _jsonable(v)})
        return out


class CatalogError(EnvfarmError):
    """A catalog folder or one of its records cannot be read."""

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


#: One table from error class to (HTTP status, kind); the server and the SDK both read it.
HTTP_STATUS: dict[type[EnvfarmError], int] = {
    cls: cls.status_code
    for cls in (
        CatalogError, EnvNotFound, EnvLoadError, AgentError, EnvCallError, LeaseNotFound,
        LeaseUnauthorized, LeaseForbidden, LeaseGone, PoolExhausted, VerifierError, JudgeError,
        SynthesisError, LLMError, TransportError,
    )
}
