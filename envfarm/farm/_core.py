"""The farm's state machine, shared by the ``--no-ray`` process and every Serve replica.

``FarmCore`` owns the compiled envs of one process, their instance pools, the leases handed out
from them, and the reaper. HTTP, MCP, the batched path and Serve handles all go through it.
Lease ids start with the owner tag of the process that made them (``<owner>-<random>``): a
request that reaches another owner means the owner is gone, and gets 410, never a fresh state.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from envfarm.catalog import Catalog, load_catalog, normalize_name
from envfarm.errors import (
    EnvfarmError,
    EnvLoadError,
    EnvNotFound,
    LeaseForbidden,
    LeaseGone,
    LeaseNotFound,
    LeaseUnauthorized,
    TaskNotFound,
)
from envfarm.farm._config import FarmConfig
from envfarm.farm._metrics import FarmMetrics
from envfarm.farm._pool import InstancePool
from envfarm.farm._status import ReplicaStatus
from envfarm.farm._window import CallWindow
from envfarm.models import CallResult, ToolSpec
from envfarm.runtime import EnvRuntime, Instance
from envfarm.verdict import EpisodeContext, EpisodeVerifier, Outcome, Verdict
from envfarm.wire import (
    BatchError,
    BatchItem,
    BatchResult,
    EnvDetail,
    EnvSummary,
    Health,
    LeaseInfo,
    LeaseRequest,
    PoolStats,
    ReleaseResponse,
    ReleaseStatus,
    VerifyRequest,
    VerifyResponse,
    new_lease_id,
    new_owner_tag,
    owner_of,
)

log = logging.getLogger("envfarm.farm")

_KEPT_ENV_ERRORS = 10

#: Makes the farm's verifier on the first verification (a verifier may start processes).
VerifierFactory = Callable[[], EpisodeVerifier]


@dataclass(eq=False)
class LeaseRecord:
    """The farm's record of one lease (the SDK's handle on it is ``envfarm.client.Lease``)."""

    lease_id: str
    env: str
    token: str
    instance: Instance
    task_idx: int | None
    expires_at: float
    idle_timeout_s: float
    idempotency_key: str | None = None
    last_used: float = field(default_factory=time.monotonic)
    #: env-side failures of tool calls since the episode began (lease or last reset)
    env_errors: list[str] = field(default_factory=list)

    def touch(self) -> None:
        self.last_used = time.monotonic()


class FarmCore:
    """Envs, pools and leases of one process (or one Serve replica)."""

    def __init__(self, config: FarmConfig, owner: str | None = None,
                 catalog: Catalog | None = None,
                 runtimes: dict[str, EnvRuntime] | None = None,
                 verifier: VerifierFactory | None = None) -> None:
        """``runtimes``: envs compiled already (they hold no lease state, so cores may share).
        ``verifier``: makes what judges ``verify`` calls (``envfarm.compose`` hands in the
        judge); without one, every verification is invalid."""
        self.config = config
        self.owner = owner or new_owner_tag()
        if "-" in self.owner:
            raise ValueError(f"owner tag {self.owner!r} may not contain '-'")
        self.catalog = catalog or load_catalog(config.catalog)
        self.problems: list[str] = []
        self.runtimes: dict[str, EnvRuntime] = {}
        self.pools: dict[str, InstancePool] = {}
        for name in self._envs_to_serve():
            try:
                runtime = (runtimes or {}).get(name) or EnvRuntime(self.catalog[name])
            except EnvLoadError as exc:
                if config.envs is not None:
                    raise  # asked for by name: fail loudly
                self.problems.append(f"{name}: {exc.message}")
                log.warning("not serving %s: %s", name, exc.message)
                continue
            self.runtimes[name] = runtime
            self.pools[name] = InstancePool(runtime, config.pool_for(name))
        self.leases: dict[str, LeaseRecord] = {}
        self._idempotent: dict[tuple[str, str], str] = {}
        self._closed: OrderedDict[str, str] = OrderedDict()  # lease id -> why it closed
        self.verifier = _LazyVerifier(verifier)
        self.metrics = FarmMetrics(self.owner, self.pool_stats, lambda: len(self.leases))
        self.window = CallWindow()  # the status page's last seconds
        self._reaper: asyncio.Task[None] | None = None

    def _envs_to_serve(self) -> list[str]:
        if self.config.envs is None:
            return self.catalog.servable
        names = [normalize_name(n) for n in self.config.envs]
        for name in names:
            if not self.catalog[name].servable:  # raises EnvNotFound for unknown names
                raise EnvLoadError(f"env {name!r} has no code to serve", env=name)
        return names

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever(), name="envfarm-reaper")

    async def aclose(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        for lease in list(self.leases.values()):
            self._close(lease, "farm shut down")
        for pool in self.pools.values():
            await pool.drain()
        await self.verifier.aclose()

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.leases.reap_interval_s)
            self.reap()

    def reap(self, now_wall: float | None = None, now_mono: float | None = None) -> int:
        """Close expired and idle leases; returns how many."""
        now_wall = time.time() if now_wall is None else now_wall
        now_mono = time.monotonic() if now_mono is None else now_mono
        reaped = 0
        for lease in list(self.leases.values()):
            if lease.expires_at <= now_wall:
                self._close(lease, "expired (its TTL ran out)")
            elif now_mono - lease.last_used >= lease.idle_timeout_s:
                self._close(lease, f"reaped after {lease.idle_timeout_s:g} s idle")
            else:
                continue
            reaped += 1
        return reaped

    # -- catalog --------------------------------------------------------------------------------
    def env_names(self) -> list[str]:
        return sorted(self.runtimes)

    def summaries(self) -> list[EnvSummary]:
        return [self._summary(name) for name in self.catalog.names]

    def _summary(self, name: str) -> EnvSummary:
        return EnvSummary.of(self.catalog[name], served=name in self.runtimes)

    def detail(self, env: str) -> EnvDetail:
        name = normalize_name(env)
        summary = self._summary(self.catalog[name].name)
        runtime = self.runtimes.get(name)
        return EnvDetail(**summary.model_dump(), task_list=list(self.catalog[name].tasks),
                         tools=runtime.tools if runtime else [],
                         pool=self.pools[name].stats() if runtime else None)

    def runtime(self, env: str) -> EnvRuntime:
        name = normalize_name(env)
        if name not in self.runtimes:
            if name in self.catalog:
                raise EnvNotFound(f"env {name!r} is in the catalog but not served here "
                                  f"(served: {', '.join(self.env_names())})", env=env)
            self.catalog[name]  # raises EnvNotFound with the known names
        return self.runtimes[name]

    def pool_stats(self) -> list[PoolStats]:
        return [p.stats() for p in self.pools.values()]

    def health(self) -> Health:
        return Health(owner=self.owner, envs=self.env_names(), leases_active=len(self.leases),
                      free_instances=sum(s.free for s in self.pool_stats()))

    def replica_status(self, app: str | None = None) -> ReplicaStatus:
        """This process's part of the status page."""
        return ReplicaStatus(owner=self.owner, app=app, pid=os.getpid(), leases=len(self.leases),
                             pools=self.pool_stats(), window=self.window.snapshot())

    # -- leases ---------------------------------------------------------------------------------
    def create_lease(self, env: str, req: LeaseRequest, mcp_prefix: str = "") -> LeaseInfo:
        started = time.perf_counter()
        runtime = self.runtime(env)
        name = runtime.name
        if req.idempotency_key is not None:
            known = self._idempotent.get((name, req.idempotency_key))
            if known is not None and known in self.leases:
                return self._info(self.leases[known], mcp_prefix)
        tasks = runtime.bundle.tasks
        if req.task_idx is not None and req.task_idx >= len(tasks):
            raise TaskNotFound(f"env {name!r} has {len(tasks)} tasks; no task_idx {req.task_idx}",
                               env=name, task_idx=req.task_idx)
        policy = self.config.leases
        ttl = min(req.ttl_s or policy.default_ttl_s, policy.max_ttl_s)
        instance = self.pools[name].acquire()
        lease = LeaseRecord(lease_id=new_lease_id(self.owner), env=name,
                            token=secrets.token_urlsafe(24), instance=instance,
                            task_idx=req.task_idx, expires_at=time.time() + ttl,
                            idle_timeout_s=min(policy.idle_timeout_s, ttl),
                            idempotency_key=req.idempotency_key)
        self.leases[lease.lease_id] = lease
        if req.idempotency_key is not None:
            self._idempotent[(name, req.idempotency_key)] = lease.lease_id
        self.metrics.lease_events.labels(name, "created").inc()
        self.metrics.lease_latency.labels(name).observe(time.perf_counter() - started)
        return self._info(lease, mcp_prefix)

    def create_leases(self, env: str, req: LeaseRequest, count: int) -> list[LeaseInfo]:
        """``count`` leases at once (idempotency keys get ``-<i>`` suffixes)."""
        out = []
        for i in range(count):
            key = None if req.idempotency_key is None else f"{req.idempotency_key}-{i}"
            out.append(self.create_lease(env, req.model_copy(update={"idempotency_key": key})))
        return out

    def _info(self, lease: LeaseRecord, mcp_prefix: str) -> LeaseInfo:
        task = None
        if lease.task_idx is not None:
            task = self.runtimes[lease.env].bundle.tasks[lease.task_idx]
        return LeaseInfo(lease_id=lease.lease_id, env=lease.env, token=lease.token,
                         expires_at=lease.expires_at, idle_timeout_s=lease.idle_timeout_s,
                         mcp_url=f"{mcp_prefix}/envs/{lease.env}/leases/{lease.lease_id}/mcp",
                         task_idx=lease.task_idx, task=task)

    def lease(self, env: str | None, lease_id: str, token: str | None) -> LeaseRecord:
        """The lease, if the caller may use it: 401 / 403 / 404 / 410 otherwise."""
        if not token:
            raise LeaseUnauthorized("lease calls need 'Authorization: Bearer <lease token>'",
                                    lease_id=lease_id)
        lease = self.leases.get(lease_id)
        if lease is None:
            raise self._missing(lease_id)
        if env is not None and normalize_name(env) != lease.env:
            raise LeaseNotFound(f"lease {lease_id} is not a lease of env {env!r}",
                                lease_id=lease_id)
        if not hmac.compare_digest(lease.token, token):
            raise LeaseForbidden(f"wrong token for lease {lease_id}", lease_id=lease_id)
        if lease.expires_at <= time.time():
            self._close(lease, "expired (its TTL ran out)")
            raise self._missing(lease_id)
        lease.touch()
        return lease

    def _missing(self, lease_id: str) -> EnvfarmError:
        why = self._closed.get(lease_id)
        if why is not None:
            return LeaseGone(f"lease {lease_id} is closed: {why}; start a new lease",
                             lease_id=lease_id, reason=why)
        owner = owner_of(lease_id)
        if owner and owner != self.owner:
            return LeaseGone(f"lease {lease_id} belongs to replica {owner!r}, which is gone; its "
                             "state is lost, start a new lease", lease_id=lease_id, owner=owner)
        return LeaseNotFound(f"no lease {lease_id}", lease_id=lease_id)

    def release(self, env: str | None, lease_id: str, token: str | None) -> ReleaseResponse:
        """Idempotent: ``closed`` the first time, ``already_closed`` after."""
        try:
            lease = self.lease(env, lease_id, token)
        except LeaseGone:
            if lease_id in self._closed:
                return ReleaseResponse(lease_id=lease_id, status=ReleaseStatus.already_closed)
            raise
        self._close(lease, "released by its holder")
        return ReleaseResponse(lease_id=lease_id, status=ReleaseStatus.closed)

    def _close(self, lease: LeaseRecord, why: str) -> None:
        if self.leases.pop(lease.lease_id, None) is None:
            return
        if lease.idempotency_key is not None:
            self._idempotent.pop((lease.env, lease.idempotency_key), None)
        self._closed[lease.lease_id] = why
        while len(self._closed) > self.config.leases.tombstones:
            self._closed.popitem(last=False)
        self.pools[lease.env].release(lease.instance)
        self.metrics.lease_events.labels(lease.env, why.split(" ")[0]).inc()

    # -- per-lease operations -------------------------------------------------------------------
    def tools(self, lease: LeaseRecord) -> list[ToolSpec]:
        return lease.instance.tools

    async def call(self, lease: LeaseRecord, tool: str, arguments: dict) -> CallResult:
        res = await lease.instance.call(tool, arguments)
        lease.touch()
        outcome = "ok" if res.ok else (res.error.kind if res.error else "env_error")
        if outcome == "env_error" and len(lease.env_errors) < _KEPT_ENV_ERRORS:
            # The episode can no longer be scored (see ``verify``); the first few say why.
            lease.env_errors.append(f"{tool}: {res.error.message if res.error else '?'}"[:300])
        self.metrics.calls.labels(lease.env, outcome).inc()
        self.metrics.call_latency.labels(lease.env).observe(res.elapsed_ms / 1000)
        self.window.record_call(lease.env, outcome, res.elapsed_ms / 1000)
        return res

    async def reset(self, lease: LeaseRecord) -> None:
        async with lease.instance.lock:
            lease.instance.reset()
            lease.env_errors.clear()  # a new episode begins

    async def snapshot(self, lease: LeaseRecord) -> bytes:
        async with lease.instance.lock:
            return lease.instance.snapshot()

    async def verify(self, lease: LeaseRecord, req: VerifyRequest) -> VerifyResponse:
        task_idx = req.task_idx if req.task_idx is not None else lease.task_idx
        bundle = self.catalog[lease.env]
        if task_idx is None:
            raise TaskNotFound(f"lease {lease.lease_id} is bound to no task; pass task_idx",
                               lease_id=lease.lease_id)
        if task_idx >= len(bundle.tasks):
            raise TaskNotFound(f"env {lease.env!r} has {len(bundle.tasks)} tasks; no task_idx "
                               f"{task_idx}", env=lease.env, task_idx=task_idx)
        if lease.env_errors:
            # The env failed the agent during this episode: no verdict on the agent (the
            # judge's rule 6), whatever the databases say.
            verdict = Verdict.of(Outcome.environment_error,
                                 f"env_error during the episode: {lease.env_errors[0]}",
                                 error_kind="env_error",
                                 details={"env_errors": list(lease.env_errors)})
        else:
            async with lease.instance.lock:
                initial, final = lease.instance.initial_snapshot(), lease.instance.snapshot()
            verifier = bundle.code_verifiers.get(task_idx)
            sql = bundle.verifiers.get(task_idx)  # what an llm-path judge reads instead
            context = EpisodeContext(
                task=bundle.tasks[task_idx], task_idx=task_idx, scenario=lease.env,
                trajectory=req.trajectory, sql_code=sql.code if sql else None,
                sql_raw_response=sql.raw_response if sql else None)
            verdict = await (await self.verifier.get()).verify(
                verifier.code if verifier else None, initial, final,
                final_answer=req.final_answer, context=context)
        lease.touch()
        self.metrics.verifications.labels(lease.env, verdict.outcome.value).inc()
        self.window.record_verification(lease.env, verdict.outcome.value)
        return VerifyResponse(task_idx=task_idx, **verdict.model_dump(exclude={"reward", "valid"}))

    async def batch_call(self, items: list[BatchItem]) -> list[BatchResult]:
        """Many leases' calls; calls on different leases run concurrently, one lease's in order."""
        async def one(item: BatchItem) -> BatchResult:
            try:
                lease = self.lease(item.env, item.lease_id, item.token)
            except EnvfarmError as exc:
                return BatchResult(lease_id=item.lease_id, error=BatchError.of(exc))
            return BatchResult(lease_id=item.lease_id,
                               result=await self.call(lease, item.tool, item.arguments))

        return list(await asyncio.gather(*(one(i) for i in items)))


class _NoVerifier:
    """The verifier of a farm composed without one: every verification is invalid."""

    async def verify(self, code: str | None, initial_db: bytes, final_db: bytes, *,
                     final_answer: str | None = None,
                     context: EpisodeContext | None = None) -> Verdict:
        return Verdict.of(Outcome.invalid, "verifier_error: this farm was started without a "
                          "verifier", error_kind="verifier_error")

    async def aclose(self) -> None:
        return None


class _LazyVerifier:
    """Makes the verifier on the first verification, not at farm start-up (it may start
    worker processes, and most replicas of a busy farm never verify)."""

    def __init__(self, factory: VerifierFactory | None) -> None:
        self._factory = factory
        self._verifier: EpisodeVerifier | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> EpisodeVerifier:
        async with self._lock:
            if self._verifier is None:
                self._verifier = (await asyncio.to_thread(self._factory) if self._factory
                                  else _NoVerifier())
            return self._verifier

    async def aclose(self) -> None:
        if self._verifier is not None:
            await self._verifier.aclose()
            self._verifier = None
