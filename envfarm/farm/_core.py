"""The farm's state machine, shared by the ``--no-ray`` process and every Serve replica.

``FarmCore`` owns the envs of one process (``EnvLoader`` loads them), their instance pools, the
leases handed out from them, and the reaper (``_verify`` decides what a verification returns).
HTTP, MCP, the batched path and Serve handles all go through it. Lease ids start with the owner
tag of the process that made them (``<owner>-<random>``): a request that reaches another owner
means the owner is gone, and gets 410, never a fresh state.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time

from envfarm.catalog import Catalog, load_catalog, normalize_name
from envfarm.confined.runtime import EnvRuntime
from envfarm.errors import (
    EnvfarmError,
    EnvNotFound,
    LeaseError,
    LeaseForbidden,
    LeaseGone,
    LeaseNotFound,
    LeaseUnauthorized,
    PoolExhausted,
    TaskNotFound,
)
from envfarm.farm._capability import mcp_path
from envfarm.farm._config import FarmConfig
from envfarm.farm._lease import LeaseRecord, LeaseTable
from envfarm.farm._loader import EnvLoader
from envfarm.farm._metrics import FarmMetrics
from envfarm.farm._quarantine import Quarantine, QuarantineCollector
from envfarm.farm._registry import EnvRegistry
from envfarm.farm._schemas import render_tools
from envfarm.farm._served import InstanceHandle, ServedEnv
from envfarm.farm._status import ReplicaStatus
from envfarm.farm._tenants import TenantCollector, Tenants
from envfarm.farm._verify import LazyVerifier, VerifierFactory, VerifyGate, episode_verdict
from envfarm.farm._window import CallWindow
from envfarm.models import CallResult, ToolSpec
from envfarm.wire import (
    BatchError,
    BatchItem,
    BatchResult,
    EnvDetail,
    EnvSummary,
    ForkRequest,
    Health,
    LeaseInfo,
    LeaseRequest,
    PoolStats,
    ReleaseResponse,
    ReleaseStatus,
    VerifyRequest,
    VerifyResponse,
    new_owner_tag,
)
from envfarm.worker import InstanceClosed, WorkerLost

_KEPT_ENV_ERRORS = 10


class FarmCore:
    """Envs, pools and leases of one process (or one Serve replica)."""

    def __init__(self, config: FarmConfig, owner: str | None = None,
                 catalog: Catalog | None = None,
                 runtimes: dict[str, EnvRuntime] | None = None,
                 verifier: VerifierFactory | None = None, verify_slots: int = 64) -> None:
        """``runtimes``: envs compiled already in this process (trusted: they are served
        in-process, whatever ``config.isolation`` says). ``verifier``: makes what judges
        ``verify`` calls (``cluster.compose`` hands in the judge); without one, every
        verification is invalid. ``verify_slots``: verifications at once (the verifier's own
        concurrency); beyond it tenants take turns."""
        self.config = config
        self.owner = owner or new_owner_tag()
        if "-" in self.owner:
            raise ValueError(f"owner tag {self.owner!r} may not contain '-'")
        self.catalog = catalog or load_catalog(config.catalog, check_code=False)
        self.problems: list[str] = []
        self.loader = EnvLoader(config, self.catalog, runtimes or {})
        self.isolation = self.loader.isolation
        #: The loaded envs (all served envs, unless types load on demand: see ``registry``).
        self.envs: dict[str, ServedEnv] = self.loader.load_at_start(self.problems)
        #: the tools as MCP lists them, per env (HTTP lists the runtime's exact schemas);
        #: an on-demand type's are added when it loads (``_cold_load``)
        self.tool_specs = {name: render_tools(served, config.tool_schemas)
                           for name, served in self.envs.items()}
        on_demand = self.loader.on_demand
        self.registry = EnvRegistry(
            [n for n in self.loader.names if n in self.envs or on_demand], self._cold_load,
            loaded=self.envs, on_demand=on_demand, hot=self.loader.hot,
            evict_idle_s=config.evict_idle_s, problems=self.problems,
            max_loaded=config.max_loaded_types, retry_s=config.broken_retry_s,
            catalog_changed=self.loader.catalog_changed)
        self.table = LeaseTable(self.owner, config.leases)
        self.leases = self.table.open  # open leases by id
        self.verifier = LazyVerifier(verifier)
        self.verify_gate = VerifyGate(verify_slots)
        self.metrics = FarmMetrics(self.owner, self.pool_stats, lambda: len(self.leases),
                                   self.registry.counts)
        self.tenants = Tenants(config.tenants)
        self.metrics.registry.register(TenantCollector(self.owner, self.tenants))
        self.quarantine = Quarantine(config.quarantine, self.owner, {
            name: self.catalog[name].flagged for name in self.loader.names if self.catalog[name].flagged})
        self.metrics.registry.register(QuarantineCollector(self.owner, self.quarantine))
        self.window = CallWindow()  # the status page's last seconds
        self._reaper: asyncio.Task[None] | None = None

    def _cold_load(self, name: str) -> ServedEnv:
        served = self.loader.load(name, broken=name in self.registry.broken)
        self.tool_specs[name] = render_tools(served, self.config.tool_schemas)
        return served

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
        await self.registry.aclose()
        self.loader.close()
        await self.verifier.aclose()

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.leases.reap_interval_s)
            self.reap()
            await self.registry.evict_idle()

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
        """Every env this process serves, loaded or not."""
        return sorted(self.registry.names)

    def summaries(self) -> list[EnvSummary]:
        return [self._summary(name) for name in self.catalog.names]

    def _summary(self, name: str) -> EnvSummary:
        served = name in self.registry.names
        return EnvSummary.of(self.catalog[name], served=served,
                             state=self.registry.state(name) if served else None)

    def detail(self, env: str) -> EnvDetail:
        name = normalize_name(env)
        summary = self._summary(self.catalog[name].name)
        served = self.envs.get(name)
        return EnvDetail(**summary.model_dump(), task_list=list(self.catalog[name].tasks),
                         tools=served.tools if served else [],
                         pool=served.pool_stats() if served else None)

    def served_name(self, env: str) -> str:
        """The normalized name of an env this process serves (EnvNotFound otherwise)."""
        name = normalize_name(env)
        if name not in self.registry.names:
            if name in self.catalog:
                names = self.env_names()
                raise EnvNotFound(f"env {name!r} is in the catalog but not served here "
                                  f"({len(names)} served: {', '.join(names[:20])})", env=env)
            self.catalog[name]  # raises EnvNotFound with the known names
        return name

    async def warm(self, env: str, key: str | None = None) -> EnvDetail:
        """Load an env now (a trainer about to use it spares its first lease the cold start).
        ``key``: the caller's farm API key; a cold start costs a worker, so warming takes the
        same key as creating a lease (401 / 403 before anything loads)."""
        self.tenants.identify(key)
        name = self.served_name(env)
        await self.registry.get(name)
        return self.detail(name)

    def pool_stats(self) -> list[PoolStats]:
        return [served.pool_stats() for served in self.envs.values()]

    def health(self) -> Health:
        """Ready: every env's pool was built and filled in ``__init__``, before any request
        (the Serve front adds whether every env's app runs and is routable)."""
        return Health(owner=self.owner, envs=self.env_names(), leases_active=len(self.leases),
                      free_instances=sum(s.free for s in self.pool_stats()),
                      isolation=self.isolation)

    def replica_status(self, app: str | None = None) -> ReplicaStatus:
        """This process's part of the status page."""
        return ReplicaStatus(owner=self.owner, app=app, pid=os.getpid(), leases=len(self.leases),
                             pools=self.pool_stats(), window=self.window.snapshot(),
                             isolation=self.isolation, tenants=self.tenants.status(),
                             types=self.registry.counts(), quarantined=self.quarantine.listing())

    # -- leases ---------------------------------------------------------------------------------
    async def create_lease(self, env: str, req: LeaseRequest, mcp_prefix: str = "",
                           key: str | None = None) -> LeaseInfo:
        """``key``: the caller's farm API key."""
        tenant = self.tenants.identify(key)
        name = self.served_name(env)  # unknown env: 404 before any quota is used
        known = self.table.made_by(tenant, name, req.idempotency_key)
        if known is not None:  # a repeat: no quota used
            return self._info(known, mcp_prefix)
        self.tenants.admit_leases(tenant)  # reserves one lease of the tenant's quota
        opened = False
        try:
            info, opened = await self._open(env, req, mcp_prefix, tenant)
            return info
        finally:
            if not opened:
                self.tenants.unreserve(tenant, 1)

    async def create_leases(self, env: str, req: LeaseRequest, count: int,
                            mcp_prefix: str = "", key: str | None = None) -> list[LeaseInfo]:
        """``count`` leases at once (idempotency keys get ``-<i>`` suffixes), admitted by the
        tenant's quota all together or not at all."""
        tenant = self.tenants.identify(key)
        name = self.served_name(env)
        keys = [None if req.idempotency_key is None else f"{req.idempotency_key}-{i}"
                for i in range(count)]
        fresh = sum(self.table.made_by(tenant, name, k) is None for k in keys)
        self.tenants.admit_leases(tenant, fresh)
        out, opened = [], 0
        try:
            for k in keys:
                info, new = await self._open(
                    env, req.model_copy(update={"idempotency_key": k}), mcp_prefix, tenant)
                out.append(info)
                opened += new
        finally:
            self.tenants.unreserve(tenant, fresh - opened)
        return out

    async def _open(self, env: str, req: LeaseRequest, mcp_prefix: str, tenant: str
                    ) -> tuple[LeaseInfo, bool]:
        """A lease for an admitted request: (its info, whether it is new); an idempotent
        repeat gets the lease its key made."""
        started = time.perf_counter()
        name = self.served_name(env)
        known = self.table.made_by(tenant, name, req.idempotency_key)
        if known is not None:
            return self._info(known, mcp_prefix), False
        tasks = self.catalog[name].tasks
        if req.task_idx is not None and req.task_idx >= len(tasks):
            raise TaskNotFound(f"env {name!r} has {len(tasks)} tasks; no task_idx {req.task_idx}",
                               env=name, task_idx=req.task_idx)
        self.quarantine.admit(name, req.task_idx)
        self.registry.pin(name)  # not evicted while this lease is being made
        try:
            served = await self.registry.get(name)
            instance = await served.acquire(tenant, req.task_idx)
        finally:
            self.registry.unpin(name)
        known = self.table.made_by(tenant, name, req.idempotency_key)  # made meanwhile?
        if known is not None:
            served.release(instance)
            return self._info(known, mcp_prefix), False
        lease = self._register(name, instance, req.task_idx, req.ttl_s, req.idempotency_key,
                               tenant)
        self.metrics.lease_events.labels(name, "created").inc()
        self.metrics.lease_latency.labels(name).observe(time.perf_counter() - started)
        return self._info(lease, mcp_prefix), True

    def _register(self, name: str, instance: InstanceHandle, task_idx: int | None,
                  ttl_s: float | None, idempotency_key: str | None, tenant: str
                  ) -> LeaseRecord:
        """Enter a new lease on ``instance`` in the table (its tenant's quota was admitted)."""
        lease = self.table.add(name, instance, task_idx, ttl_s, idempotency_key, tenant)
        self.tenants.opened(tenant)
        return lease

    async def fork(self, parent: LeaseRecord, req: ForkRequest, mcp_prefix: str = ""
                   ) -> LeaseInfo:
        """A new lease of the parent's tenant (its quota admits it) and task, whose database is
        the parent's now and whose steps and env errors so far are the parent's; the parent
        goes on untouched. Cost: an instance and a copy of the database (inside the worker when
        the child lands on the parent's), no reset."""
        started = time.perf_counter()
        served = self.envs[parent.env]
        if getattr(served, "per_lease", False):
            raise LeaseError(f"env {parent.env!r} keeps module-level state, which a fork cannot "
                             "copy (only the database): it cannot be forked", env=parent.env)
        known = self.table.made_by(parent.tenant, parent.env, req.idempotency_key)
        if known is not None:  # a repeat: the fork it made
            return self._info(known, mcp_prefix)
        self.quarantine.admit(parent.env, parent.task_idx)  # a fork is a new lease of the task
        self.tenants.admit_leases(parent.tenant)
        opened = False
        try:
            instance = await served.acquire(parent.tenant, parent.task_idx)  # the task's start
            try:  # the parent's state at one moment: read under its lock
                await instance.copy_from(self.held(parent).instance)
            except WorkerLost as exc:
                served.release(instance)
                if parent.instance.lost is not None:
                    raise self._lost(parent, exc.reason) from None
                raise PoolExhausted(f"env {parent.env!r}: the fork's worker was lost "
                                    f"({exc.reason}); retry", env=parent.env) from None
            except EnvfarmError:
                served.release(instance)
                raise
            child = self._register(parent.env, instance, parent.task_idx, req.ttl_s,
                                   req.idempotency_key, parent.tenant)
            opened = True
        finally:
            if not opened:
                self.tenants.unreserve(parent.tenant, 1)
        child.steps, child.env_errors = parent.steps.copy(), list(parent.env_errors)
        child.agent_requests, child.forked_from = parent.agent_requests, parent.lease_id
        self.metrics.lease_events.labels(parent.env, "forked").inc()
        self.metrics.lease_latency.labels(parent.env).observe(time.perf_counter() - started)
        return self._info(child, mcp_prefix)

    def _info(self, lease: LeaseRecord, mcp_prefix: str) -> LeaseInfo:
        task = None
        if lease.task_idx is not None:
            task = self.envs[lease.env].bundle.tasks[lease.task_idx]
        return LeaseInfo(lease_id=lease.lease_id, env=lease.env, token=lease.token,
                         expires_at=lease.expires_at, idle_timeout_s=lease.idle_timeout_s,
                         mcp_url=mcp_prefix.rstrip("/") + mcp_path(lease.env, lease.lease_id,
                                                                   lease.token),
                         task_idx=lease.task_idx, task=task, forked_from=lease.forked_from)

    def lease(self, env: str | None, lease_id: str, token: str | None) -> LeaseRecord:
        """The lease, if the caller may use it: 401 / 403 / 404 / 410 otherwise."""
        if not token:
            self._refused(lease_id)
            raise LeaseUnauthorized("lease calls need 'Authorization: Bearer <lease token>'",
                                    lease_id=lease_id)
        lease = self.leases.get(lease_id)
        if lease is None:
            raise self._missing(lease_id)
        if env is not None and normalize_name(env) != lease.env:
            raise LeaseNotFound(f"lease {lease_id} is not a lease of env {env!r}",
                                lease_id=lease_id)
        if not hmac.compare_digest(lease.token, token):
            lease.refused += 1
            raise LeaseForbidden(f"wrong token for lease {lease_id}", lease_id=lease_id)
        if lease.expires_at <= time.time():
            self._close(lease, "expired (its TTL ran out)")
            raise self._missing(lease_id)
        if lease.instance.lost is not None:
            raise self._lost(lease, lease.instance.lost)
        lease.touch()
        return lease

    def _lost(self, lease: LeaseRecord, why: str) -> LeaseGone:
        """Close a lease whose instance died with its worker: typed 410, never a fresh state."""
        self.quarantine.record_call(lease.env, lease.task_idx, bad=True)
        self._close(lease, f"lease_lost: {why}")
        return LeaseGone(f"lease {lease.lease_id} is lost: {why}; its episode is invalid, "
                         "start a new lease", lease_id=lease.lease_id, reason="lease_lost")

    def _refused(self, lease_id: str) -> None:
        lease = self.leases.get(lease_id)
        if lease is not None:
            lease.refused += 1

    def held(self, lease: LeaseRecord) -> LeaseRecord:
        """The lease, if it is still open: checked again where a request waited (a body read,
        a framework's dispatch) after its first check, so a call never lands on an instance
        the lease gave back (and that may serve another lease by now)."""
        if self.leases.get(lease.lease_id) is not lease:
            raise self._missing(lease.lease_id)
        return lease

    def admit_call(self, lease: LeaseRecord) -> None:
        """Count a tool call against the lease's tenant (429 over quota)."""
        self.tenants.admit_call(lease.tenant)

    def _missing(self, lease_id: str) -> EnvfarmError:
        return self.table.missing(lease_id)

    def release(self, env: str | None, lease_id: str, token: str | None) -> ReleaseResponse:
        """Idempotent: ``closed`` the first time, ``already_closed`` after."""
        try:
            lease = self.lease(env, lease_id, token)
        except LeaseGone:
            if self.table.closed_why(lease_id) is not None:
                return ReleaseResponse(lease_id=lease_id, status=ReleaseStatus.already_closed)
            raise
        self._close(lease, "released by its holder")
        return ReleaseResponse(lease_id=lease_id, status=ReleaseStatus.closed)

    def _close(self, lease: LeaseRecord, why: str) -> None:
        if not self.table.remove(lease, why):
            return
        self.tenants.closed(lease.tenant)
        self.envs[lease.env].release(lease.instance)
        self.registry.touch(lease.env)
        self.metrics.lease_events.labels(lease.env, why.split(" ")[0]).inc()

    # -- per-lease operations -------------------------------------------------------------------
    def tools(self, lease: LeaseRecord) -> list[ToolSpec]:
        lease.agent_requests += 1
        return lease.instance.tools

    async def call(self, lease: LeaseRecord, tool: str, arguments: dict) -> CallResult:
        lease.agent_requests += 1
        try:
            res = await self.held(lease).instance.call(tool, arguments)
        except WorkerLost as exc:
            raise self._lost(lease, exc.reason) from None
        except InstanceClosed:  # released while this call waited for the lease's last one
            raise self._missing(lease.lease_id) from None
        lease.touch()
        outcome = "ok" if res.ok else (res.error.kind if res.error else "env_error")
        lease.steps.append(tool, outcome)
        if outcome == "env_error" and len(lease.env_errors) < _KEPT_ENV_ERRORS:
            # The episode can no longer be scored (see ``verify``); the first few say why.
            lease.env_errors.append(f"{tool}: {res.error.message if res.error else '?'}"[:300])
        self.quarantine.record_call(lease.env, lease.task_idx, outcome == "env_error")
        self.metrics.calls.labels(lease.env, outcome).inc()
        self.metrics.call_latency.labels(lease.env).observe(res.elapsed_ms / 1000)
        self.window.record_call(lease.env, outcome, res.elapsed_ms / 1000)
        return res

    async def reset(self, lease: LeaseRecord) -> None:
        try:
            await self.held(lease).instance.reset()
        except WorkerLost as exc:
            raise self._lost(lease, exc.reason) from None
        except InstanceClosed:
            raise self._missing(lease.lease_id) from None
        lease.env_errors.clear()  # a new episode begins
        lease.steps.clear()

    async def snapshot(self, lease: LeaseRecord) -> bytes:
        try:
            return await self.held(lease).instance.snapshot()
        except WorkerLost as exc:
            raise self._lost(lease, exc.reason) from None
        except InstanceClosed:
            raise self._missing(lease.lease_id) from None

    async def verify(self, lease: LeaseRecord, req: VerifyRequest) -> VerifyResponse:
        task_idx, verdict = await episode_verdict(
            lease, self.catalog[lease.env], req, lambda: self.snapshot(lease), self.verifier,
            self.verify_gate)
        lease.touch()
        # a lease whose agent never connected says nothing about the env
        self.quarantine.record_verification(lease.env, task_idx,
                                            not verdict.valid and verdict.error_kind != "unauthorized")
        self.metrics.verifications.labels(lease.env, verdict.outcome.value).inc()
        self.window.record_verification(lease.env, verdict.outcome.value)
        return VerifyResponse(task_idx=task_idx, **verdict.model_dump(exclude={"reward", "valid"}))

    async def batch_call(self, items: list[BatchItem]) -> list[BatchResult]:
        """Many leases' calls; calls on different leases run concurrently, one lease's in order."""
        async def one(item: BatchItem) -> BatchResult:
            try:
                lease = self.lease(item.env, item.lease_id, item.token)
                self.admit_call(lease)
                result = await self.call(lease, item.tool, item.arguments)
            except EnvfarmError as exc:
                return BatchResult(lease_id=item.lease_id, error=BatchError.of(exc))
            return BatchResult(lease_id=item.lease_id, result=result)

        return list(await asyncio.gather(*(one(i) for i in items)))

