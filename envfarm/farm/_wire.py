"""Wire models of the lease API: every request and response body is one of these."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from envfarm.models import CallResult, ToolSpec


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvSummary(_Wire):
    """One environment in the catalog listing."""

    name: str = Field(description="AWM-normalized scenario name.")
    description: str = Field(default="", description="Scenario description.")
    tasks: int = Field(description="Number of tasks.")
    verified_tasks: list[int] = Field(default_factory=list,
                                      description="Task indexes with a code-mode verifier.")
    served: bool = Field(description="Whether this farm serves leases of the env.")


class EnvDetail(EnvSummary):
    """One environment with its tasks and tools."""

    task_list: list[str] = Field(default_factory=list, description="The tasks, by index.")
    tools: list[ToolSpec] = Field(default_factory=list, description="Tools of a served env.")
    pool: PoolStats | None = Field(default=None, description="Pool of this process/replica.")


class PoolStats(_Wire):
    """Instances of one env held by one process or replica."""

    env: str
    free: int = Field(description="Reset instances ready to lease.")
    leased: int = Field(description="Instances held by leases.")
    resetting: int = Field(description="Released instances being reset in the background.")
    warm_target: int = Field(description="How many free instances the pool keeps ready.")
    max_instances: int = Field(description="Upper bound of instances in this pool.")


class LeaseRequest(_Wire):
    """Body of ``POST /envs/{env}/leases``."""

    task_idx: int | None = Field(default=None, ge=0, description="Bind the lease to a task.")
    ttl_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600,
                                description="Lifetime; the farm's default when omitted.")
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200,
                                        description="Retrying with the same key returns the "
                                                    "same lease instead of a second one.")


class LeaseInfo(_Wire):
    """A granted lease. ``token`` goes in ``Authorization: Bearer`` on every lease call."""

    lease_id: str = Field(description="Names the lease and its owner replica.")
    env: str
    token: str = Field(description="Bearer token of this lease.")
    expires_at: float = Field(description="Unix time after which the lease is reaped.")
    idle_timeout_s: float = Field(description="Idle time after which the lease is reaped.")
    mcp_url: str = Field(description="Path of the lease's MCP endpoint (streamable HTTP).")
    task_idx: int | None = None
    task: str | None = Field(default=None, description="The task text, when bound to one.")


class LeaseBatchRequest(LeaseRequest):
    """Body of ``POST /envs/{env}/leases:batch``: ``count`` leases alike (a GRPO group)."""

    count: int = Field(default=1, ge=1, le=1024, description="How many leases.")


class CallRequest(_Wire):
    """Body of ``POST …/leases/{id}/call``."""

    tool: str = Field(min_length=1, max_length=200, description="Tool name.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Flat JSON arguments.")


class CallResponse(CallResult):
    """Outcome of one tool call: ``{ok, result}`` or ``{ok: false, error: {kind, message}}``."""


class ResetResponse(_Wire):
    lease_id: str
    reset: bool = True


class VerifyRequest(_Wire):
    """Body of ``POST …/leases/{id}/verify``; the lease's task when ``task_idx`` is omitted."""

    task_idx: int | None = Field(default=None, ge=0)
    final_answer: str | None = Field(default=None, max_length=100_000,
                                     description="The agent's final answer, if any.")


class VerifyResponse(_Wire):
    """Verdict of the code-mode verifier on the lease's initial vs current state."""

    task_idx: int
    outcome: str = Field(description="The judge's outcome: completed, agent_error, invalid, ... "
                                     "(judge.Outcome).")
    reward: float | None = Field(description="judge.reward_for(outcome): 1.0 completed, 0.0 not "
                                             "completed, null when invalid.")
    valid: bool = Field(description="False when the verifier (or env) failed: drop, don't score.")
    reason: str = Field("", description="One line on why.")
    details: dict[str, Any] = Field(default_factory=dict,
                                    description="What the verifier returned, or why it failed.")


class ReleaseStatus(str, Enum):
    closed = "closed"
    already_closed = "already_closed"


class ReleaseResponse(_Wire):
    lease_id: str
    status: ReleaseStatus


class BatchItem(_Wire):
    """One tool call of a batch: which lease, its token, the call."""

    env: str = Field(description="The lease's env (routes the item to its deployment).")
    lease_id: str
    token: str
    tool: str = Field(min_length=1, max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)


class BatchRequest(_Wire):
    """Many leases' calls in one request: ``POST /envs/{env}/owners/{owner}/batch`` (all leases of
    one owner replica: one hop through Serve) or ``POST /batch/call`` (any leases, via the front).
    """

    calls: list[BatchItem] = Field(max_length=4096)


class BatchError(_Wire):
    kind: str
    message: str
    status: int = Field(description="The HTTP status this error would have had alone.")


class BatchResult(_Wire):
    """One item's outcome: a call result, or the lease-level error it hit."""

    lease_id: str
    result: CallResponse | None = None
    error: BatchError | None = None


class BatchResponse(_Wire):
    results: list[BatchResult] = Field(description="In the order of the request's calls.")


class Health(_Wire):
    status: str = "ok"
    owner: str = Field(description="Owner tag of the process/replica that answered.")
    envs: list[str]
    leases_active: int
    free_instances: int


class ErrorBody(_Wire):
    """Every error response: ``{"error": {kind, message, ...}}``."""

    error: dict[str, Any]


EnvDetail.model_rebuild()
