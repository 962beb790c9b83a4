"""Wire models of the lease API: every request and response body is one of these.

A contract: the farm answers with these and the SDK reads them; importing them loads no server.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from envfarm.errors import EnvfarmError, http_status
from envfarm.models import CallResult, EnvBundle, ToolSpec
from envfarm.verdict import Verdict

__all__ = [
    "LEASE_ID_PATTERN",
    "OWNER_PATTERN",
    "BatchError",
    "BatchItem",
    "BatchRequest",
    "BatchResponse",
    "BatchResult",
    "CallRequest",
    "EnvDetail",
    "EnvSummary",
    "ErrorBody",
    "ForkRequest",
    "ForwardedRequest",
    "ForwardedResponse",
    "Health",
    "LeaseBatchRequest",
    "LeaseInfo",
    "LeaseRequest",
    "LiftRequest",
    "PoolStats",
    "QuarantinedTask",
    "ReleaseResponse",
    "ReleaseStatus",
    "ResetResponse",
    "VerifyRequest",
    "VerifyResponse",
    "by_owner",
    "new_lease_id",
    "new_owner_tag",
    "owner_of",
]


T = TypeVar("T")
R = TypeVar("R")

# -- lease ids: ``<owner>-<random hex>``; the owner tag names the process/replica holding it ------
OWNER_PATTERN = r"^[A-Za-z0-9_]+$"
LEASE_ID_PATTERN = r"^[A-Za-z0-9_]+-[0-9a-f]+$"


def new_owner_tag() -> str:
    """A random owner tag for a process that has no Serve replica id."""
    return "p" + secrets.token_hex(4)


def new_lease_id(owner: str) -> str:
    return f"{owner}-{secrets.token_hex(8)}"


def owner_of(lease_id: str) -> str:
    """The owner tag a lease id names ('' when it names none)."""
    return lease_id.rpartition("-")[0]


async def by_owner(items: Sequence[T], where: Callable[[T], tuple[str, str]],
                   send: Callable[[str, str, list[T]], Awaitable[Sequence[R]]]) -> list[R]:
    """Send ``items`` in one request per (env, owner) of ``where(item)`` = (env, lease id), all
    at once; the answers come back in the order of ``items``. Used by the SDK, the front and
    in-cluster clients alike, so a batch takes one hop per owner replica."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, item in enumerate(items):
        env, lease_id = where(item)
        groups.setdefault((env, owner_of(lease_id)), []).append(i)
    out: list[Any] = [None] * len(items)

    async def one(env: str, owner: str, idx: list[int]) -> None:
        answers = await send(env, owner, [items[i] for i in idx])
        for i, answer in zip(idx, answers, strict=True):
            out[i] = answer

    await asyncio.gather(*(one(env, owner, idx) for (env, owner), idx in groups.items()))
    return out


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvState(str, Enum):
    """Where an env type stands in one process (on-demand farms load types at first use)."""

    loaded = "loaded"
    loading = "loading"
    cold = "cold"
    broken = "broken"


class TypeCounts(_Wire):
    """Env types of one process (or of the farm, summed), and their churn."""

    types: int = Field(default=0, description="Types served (addressable).")
    loaded: int = Field(default=0, description="Types whose workers are running.")
    loading: int = Field(default=0, description="Types being cold-started.")
    cold: int = Field(default=0, description="Types that cost nothing until leased.")
    broken: int = Field(default=0, description="Types that failed to load (skipped).")
    cold_starts: int = Field(default=0, description="Loads at first use since start.")
    evictions: int = Field(default=0, description="Types unloaded since start (idle, or "
                           "to make room under the cap).")
    max_loaded: int = Field(default=0, description="Cap on loaded + loading types (0: none).")
    evicted_for_room: int = Field(default=0, description=(
        "Evictions of the least recently used idle type to load another under the cap."))
    refused_at_cap: int = Field(default=0, description=(
        "Cold starts refused (TooManyTypesLoaded): at the cap, every loaded type in use."))
    broken_retries: int = Field(default=0, description=(
        "Loads of broken types tried again (after their backoff, or a catalog change)."))

    def __add__(self, other: TypeCounts) -> TypeCounts:
        return TypeCounts(**{k: getattr(self, k) + getattr(other, k)
                             for k in type(self).model_fields})


class EnvSummary(_Wire):
    """One environment in the catalog listing."""

    name: str = Field(description="AWM-normalized scenario name.")
    description: str = Field(default="", description="Scenario description.")
    tasks: int = Field(description="Number of tasks.")
    verified_tasks: list[int] = Field(default_factory=list,
                                      description="Task indexes with a code-mode verifier.")
    served: bool = Field(description="Whether this farm serves leases of the env.")
    state: EnvState | None = Field(default=None, description=(
        "In the process that answered: loaded, loading, cold (loads at its first lease) or "
        "broken; None when not served."))

    @classmethod
    def of(cls, bundle: EnvBundle, served: bool, state: EnvState | None = None) -> EnvSummary:
        return cls(name=bundle.name, description=bundle.description, tasks=len(bundle.tasks),
                   verified_tasks=sorted(bundle.code_verifiers), served=served, state=state)


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
    workers: int | None = Field(default=None, description=(
        "Env worker processes serving it now (None: its code runs in the front, in-process)."))
    workers_started: int | None = Field(default=None, description=(
        "Workers started over its life; more than `workers` means some were replaced."))


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
    forked_from: str | None = Field(default=None, description=(
        "The lease this one is a fork of: it began with that lease's state and steps."))
    direct_url: str | None = Field(default=None, description=(
        "Behind a multi-replica pool's Door: the base URL of the listener of the replica that "
        "owns this lease. A client inside the cluster may send the lease's requests there "
        "(same paths, same token), past HAProxy and the Door; ``Farm(direct=True)`` does."))


class ForkRequest(_Wire):
    """Body of ``POST …/leases/{id}/fork``: a new lease of the same tenant and task whose
    database is this lease's state now."""

    ttl_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600,
                                description="Lifetime of the fork; the farm's default when "
                                            "omitted.")
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200,
                                        description="Retrying with the same key returns the "
                                                    "same fork instead of a second one.")


class LeaseBatchRequest(LeaseRequest):
    """Body of ``POST /envs/{env}/leases:batch``: ``count`` leases alike (a GRPO group)."""

    count: int = Field(default=1, ge=1, le=1024, description="How many leases.")


class CallRequest(_Wire):
    """Body of ``POST …/leases/{id}/call``."""

    tool: str = Field(min_length=1, max_length=200, description="Tool name.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Flat JSON arguments.")


class ResetResponse(_Wire):
    lease_id: str
    reset: bool = True


class VerifyRequest(_Wire):
    """Body of ``POST …/leases/{id}/verify``; the lease's task when ``task_idx`` is omitted."""

    task_idx: int | None = Field(default=None, ge=0)
    final_answer: str | None = Field(default=None, max_length=100_000,
                                     description="The agent's final answer, if any.")
    trajectory: dict[str, Any] | None = Field(
        default=None, description="The episode (a judge.Trajectory as JSON): what a farm on the "
        "llm reward path shows its judge. Ignored on the code path.")


class VerifyResponse(Verdict):
    """The judge's verdict on a lease's episode (initial vs current state), and its task.

    ``environment_error`` (reward null) when a tool call of the episode failed on the env's
    side; ``invalid`` (reward null) when the verifier failed or the task has none.
    """

    task_idx: int = Field(description="The task the episode was judged against.")


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
    type: str | None = Field(default=None, description="The error's class (envfarm.errors).")
    message: str
    status: int = Field(description="The HTTP status this error would have had alone.")

    @classmethod
    def of(cls, exc: EnvfarmError) -> BatchError:
        return cls(kind=exc.kind.value, type=type(exc).__name__, message=exc.message,
                   status=http_status(type(exc)))


class BatchResult(_Wire):
    """One item's outcome: a call result, or the lease-level error it hit."""

    lease_id: str
    result: CallResult | None = None
    error: BatchError | None = None


class BatchResponse(_Wire):
    results: list[BatchResult] = Field(description="In the order of the request's calls.")


class QuarantinedTask(_Wire):
    """A task (or, with ``task_idx`` None, a whole env type) out of rotation: new leases for it
    answer ``TaskQuarantined``; trainers skip it."""

    env: str
    task_idx: int | None = Field(default=None, description="None: every task of the env type.")
    reason: str = Field(description="Why: the error counts that crossed the threshold, or the "
                                    "catalog's flag (a hack probe passes its verifier).")
    source: str = Field(description="'errors' (counted while serving) or 'flagged' (at load).")
    since: float = Field(description="Unix time it was quarantined.")
    owners: list[str] = Field(default_factory=list, description=(
        "Replicas that quarantined it (each counts its own leases)."))


class LiftRequest(_Wire):
    """``POST /quarantine/lift``: put a task (or every task of an env) back into rotation."""

    env: str
    task_idx: int | None = Field(default=None, description="None: the env type and all its tasks.")


class Health(_Wire):
    """``/healthz``: 200 when ready (every env routable with warm instances), else 503."""

    status: str = "ok"
    ready: bool = Field(default=True, description=(
        "Every env of the farm is routable with warm instances: leases can be made."))
    waiting_for: list[str] = Field(default_factory=list,
                                   description="What is not ready yet (when not ready).")
    owner: str = Field(description="Owner tag of the process/replica that answered.")
    envs: list[str]
    leases_active: int
    free_instances: int
    isolation: str = Field(default="", description=(
        "Where env code runs: confined workers, UNCONFINED workers, or in-process."))


class ErrorBody(_Wire):
    """Every error response: ``{"error": {kind, type, message, ...}}``."""

    error: dict[str, Any]


EnvDetail.model_rebuild()


# -- a request handed from one farm process to another, whole (the Serve shell's hop) ----------
class ForwardedRequest(_Wire):
    """An HTTP request one farm process hands to the pool replica that serves it, by handle:
    the Serve front for packed envs and OpenEnv steps, a pool app's door, a replica that got
    another owner's lease."""

    method: str
    path: str
    query_string: bytes = b""
    headers: list[tuple[bytes, bytes]] = Field(default_factory=list)
    body: bytes = b""

    @classmethod
    def of_scope(cls, scope: dict[str, Any], body: bytes,
                 extra_headers: Sequence[tuple[bytes, bytes]] = ()) -> ForwardedRequest:
        """The request an ASGI HTTP ``scope`` and its ``body`` make, with its full path (the
        pool routes on full paths; ASGI's path holds ``root_path`` already, but be sure)."""
        root, path = scope.get("root_path", ""), scope["path"]
        if root and not path.startswith(root):
            path = root + path
        return cls(method=scope["method"], path=path, query_string=scope.get("query_string", b""),
                   headers=[*scope.get("headers", ()), *extra_headers], body=body)


class ForwardedResponse(_Wire):
    """The answer to a ``ForwardedRequest``, whole."""

    status: int
    headers: list[tuple[bytes, bytes]] = Field(default_factory=list)
    body: bytes = b""
