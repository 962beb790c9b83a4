"""One env type served from worker processes, as the front sees it.

``WorkerEnv`` loads the env in a first worker (its tools and initial database come back over
the channel), places leases' instances on workers (at most ``leases_per_worker`` each, and the
leases of one tenant only: a worker holds one tenant's leases for life, so env code one tenant's
calls set off never shares a process with another tenant's leases), starts another worker
before the free slots run out, stops idle ones, watches their CPU (``CpuWatch``) and keeps a
ward of fresh workers where the requests in flight on a lost worker are sent again one at a
time (``quarantine``). ``RemoteInstance`` is a lease's handle on its instance in a worker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from envfarm.confined import frames
from envfarm.errors import PoolExhausted
from envfarm.models import EnvBundle, ToolSpec
from envfarm.wire import PoolStats
from envfarm.worker._committed import Template
from envfarm.worker._instance import RemoteInstance
from envfarm.worker._process import WorkerProcess, WorkerStartError
from envfarm.worker._spares import SpareWorkers
from envfarm.worker._spawn import WorkerLost
from envfarm.worker._watch import CpuWatch

_SQLITE_MAGIC = b"SQLite format 3\x00"
#: Worker starts at once when many leases wait for room (each ~1 s of CPU, ~50 MiB).
MAX_STARTS_AT_ONCE = 4
log = logging.getLogger("envfarm.worker")


@dataclass(frozen=True)
class WorkerOptions:
    """How env workers run (one set per farm process or Serve replica)."""

    leases_per_worker: int = 64
    #: A worker that has held no lease this long stops (while the others keep ``warm`` free
    #: slots). Not at once: leases come and go in steps (a GRPO step leases a batch and gives
    #: it all back), and stopping a worker the next step starts again cost a worker's start
    #: (~1 s of CPU) per step and type; around the warm threshold it churned on every release.
    retire_idle_s: float = 30.0
    call_timeout_s: float = 10.0
    #: A worker that has not answered a call by call_timeout_s + this is killed.
    deadline_grace_s: float = 2.0
    start_timeout_s: float = 60.0
    memory_mb: int = 2048
    #: False only with --allow-unconfined (a kernel without seccomp/landlock).
    jail: bool = True
    foreign_keys: bool = False
    max_payload_bytes: int = 1 << 20
    #: Let workers write to the front's stderr (debugging a catalog).
    stderr: bool = False
    #: At load, find module-level state that tool calls change (``envfarm.confined.probing.module_state_leaks``);
    #: such an env gets a fresh worker per lease.
    probe_module_state: bool = True
    #: How often the CPU watch looks (0: never), and the share of the time a worker's threads
    #: may be runnable with no request in flight / with one (``CpuWatch``).
    cpu_check_s: float = 1.0
    idle_cpu_share: float = 0.25
    busy_cpu_share: float = 2.0
    #: Bytes of its leases' committed state (pages they wrote) the front keeps per worker:
    #: a worker whose leases grow past it is killed, the lease that crossed it lost. AWM's
    #: databases are ~0.3 MB and an episode writes a few pages: 4 MiB a lease on average.
    kept_bytes_per_worker: int = 256 << 20

    def worker_config(self) -> dict[str, Any]:
        from envfarm.confined.jail import worker_identity  # root: each worker gets a uid of its own

        return {"jail": self.jail, "memory_mb": self.memory_mb, **worker_identity().config()}


class WorkerEnv:
    """An env type whose code runs in confined worker processes, never in this one."""

    isolation = "workers"

    def __init__(self, bundle: EnvBundle, options: WorkerOptions, *, warm: int = 8,
                 max_instances: int = 4096, module_state: list[str] | None = None,
                 spares: SpareWorkers | None = None) -> None:
        """Starts the first worker and loads the env in it (blocking; WorkerStartError).
        ``module_state``: the probe's verdict on this code from an earlier load (the probe
        is then skipped). ``spares``: started workers to take instead of spawning."""
        self.bundle = bundle
        self.name = bundle.name
        self.options = options
        self.warm = warm
        self.max_instances = max_instances
        self.per_lease = False
        self.spares = spares
        probe = options.probe_module_state and module_state is None
        first, reply, template = self._spawn(probe=probe)
        self.template = Template(template)
        self.tools = [ToolSpec.model_validate(t) for t in reply.get("tools", [])]
        self.problems = [str(p) for p in reply.get("problems", [])]
        openapi = reply.get("openapi")
        self.openapi = openapi if isinstance(openapi, dict) else None
        self.build_seconds = float(reply.get("build_s", 0.0))
        self.tables, self.rows = int(reply.get("tables", 0)), int(reply.get("rows", 0))
        #: Globals that tool calls change: leases would see each other through them.
        self.module_state = (list(module_state) if module_state is not None
                             else [str(n) for n in reply.get("module_state", [])])
        #: Whether the probe ran in this load (False: skipped or its verdict was known).
        self.probed = probe
        self.workers: list[WorkerProcess] = [first]
        if self.module_state:
            self.per_lease = True
            self.problems.append(
                "module-level state changes with tool calls (" + ", ".join(self.module_state[:8])
                + "): each lease gets a worker of its own")
            first.kill("probed a module that keeps state: not reused")
            self.workers = []
        self._ids = itertools.count(1)
        self._task_initials: dict[int, Template] = {}  # task -> its own starting database
        self._growing: set[asyncio.Future] = set()  # worker starts under way
        self._waiting = 0  # leases waiting for a worker with room
        self.started = 1  # workers started over this env's life (replacements included)
        self.open_leases = 0
        self._retiring: asyncio.TimerHandle | None = None
        #: tenant -> the fresh worker where that tenant's suspect requests run one at a time,
        #: the lock they take turns by and how many wait (a tenant's turns never hold up
        #: another's)
        self._wards: dict[str, WorkerProcess] = {}
        self._ward_locks: dict[str, asyncio.Lock] = {}
        self._suspects: dict[str, int] = {}
        self._cpu = CpuWatch(options.idle_cpu_share, options.busy_cpu_share)
        self._watching: asyncio.TimerHandle | None = None
        self._closing = False

    def _spawn(self, probe: bool = False) -> tuple[WorkerProcess, dict[str, Any], bytes]:
        worker = (self.spares.take() if self.spares is not None
                  else WorkerProcess(self.options.worker_config(), stderr=self.options.stderr))
        load = {"op": "load", "bundle": self.bundle.model_dump(
                    mode="json", include={"name", "code", "db_schema", "sample_data",
                                          "api_spec", "task_states"}),
                "call_timeout_s": self.options.call_timeout_s,
                "max_payload_bytes": self.options.max_payload_bytes,
                "foreign_keys": self.options.foreign_keys, "probe_module_state": probe}
        reply, template = worker.start(load, self.options.start_timeout_s)
        if not template.startswith(_SQLITE_MAGIC):
            worker.kill("sent a malformed initial database")
            raise WorkerStartError(f"env {self.name!r}: the worker sent no database image")
        return worker, reply, template

    @property
    def call_deadline_s(self) -> float:
        return self.options.call_timeout_s + self.options.deadline_grace_s

    @property
    def jail(self) -> str | None:
        return self.workers[0].jail if self.workers else None

    # -- placing leases -------------------------------------------------------------------
    def _live(self) -> list[WorkerProcess]:
        self.workers = [w for w in self.workers if w.lost is None]
        return self.workers

    def draining(self) -> int:
        return sum(w.draining for w in self.workers)

    @property
    def capacity(self) -> int:
        """Leases one worker holds over its life at once (1 for an env that keeps state)."""
        return 1 if self.per_lease else self.options.leases_per_worker

    def _has_room(self, worker: WorkerProcess, tenant: str | None = None) -> bool:
        """Room for a lease of ``tenant`` (None: of some tenant)."""
        return (worker.leases < self.capacity and not worker.draining
                and not (self.per_lease and worker.placed)
                and (tenant is None or worker.tenant in (None, tenant))
                and not (self._wards and worker in self._wards.values()))

    def free_slots(self, tenant: str | None = None) -> int:
        """Free slots for ``tenant``'s leases (None: in all workers)."""
        return sum(self.capacity - w.leases for w in self._live() if self._has_room(w, tenant))

    def leased(self) -> int:
        return self.open_leases

    async def acquire(self, tenant: str = "anonymous", task_idx: int | None = None
                      ) -> RemoteInstance:
        """An instance for a new lease of ``tenant``, on a worker that holds only its leases: of
        the template, or of the task's own starting database when its bundle gives it one
        (``EnvBundle.task_states``)."""
        task = task_idx if self.bundle.task_states.get(task_idx) else None
        while True:
            worker = await self.place(tenant, new_lease=True)
            inst = RemoteInstance(self, worker, self.new_inst(), tenant)
            try:
                initial = None if task is None else await self._task_initial(worker, task)
                inst = RemoteInstance(self, worker, self.new_inst(), tenant, initial, task)
                worker.post({"op": "new", "inst": inst.inst,
                             **({} if task is None else {"task": task})})
                break
            except WorkerLost:  # it died meanwhile: place the lease on another worker
                worker.leases -= 1
        self.open_leases += 1
        self.placed(inst)
        spare = min(self.warm, 2) if self.per_lease else self.warm  # a worker each: costly
        if self.free_slots(tenant) < spare:
            self._start_growing()  # ready before the free slots run out
        return inst

    async def place(self, tenant: str, ward: WorkerProcess | None = None, *,
                    new_lease: bool = False) -> WorkerProcess:
        """Take a slot for a lease of ``tenant``: on ``ward``, else on a worker of that tenant
        or one that never held a lease (a new one if none has room)."""
        worker = ward
        while worker is None:
            live = self._live()
            worker = (next((w for w in live if w.tenant == tenant and self._has_room(w)), None)
                      or next((w for w in live if w.tenant is None and self._has_room(w)),
                              None))
            if worker is not None:
                break
            if new_lease and self.open_leases >= self.max_instances:
                raise PoolExhausted(
                    f"env {self.name!r}: all {self.max_instances} instances are leased; "
                    "release some or raise max_instances", env=self.name,
                    max_instances=self.max_instances)
            try:
                await self._grow()
            except WorkerStartError as exc:
                raise PoolExhausted(f"env {self.name!r}: no worker has room and a new one "
                                    f"did not start ({exc}); retry", env=self.name) from None
        worker.tenant = tenant  # for life: no other tenant's lease is ever placed here
        worker.leases += 1  # the slot is taken before any await: no overbooking
        worker.placed += 1
        worker.idle_since = None
        worker.on_lost = self._worker_lost
        await worker.attach()
        self._watch()
        return worker

    def new_inst(self) -> int:
        return next(self._ids)

    def placed(self, inst: RemoteInstance) -> None:
        inst.worker.held.add(inst)
        inst.worker.kept_bytes += inst.state.own

    def unplace(self, inst: RemoteInstance) -> None:
        worker = inst.worker
        worker.leases -= 1
        worker.held.discard(inst)
        worker.kept_bytes -= inst.state.own

    def keep(self, worker: WorkerProcess, grown: int) -> bool:
        """Count ``grown`` more bytes of state kept for ``worker``'s leases: within budget?"""
        worker.kept_bytes += grown
        return worker.kept_bytes <= self.options.kept_bytes_per_worker

    def _worker_lost(self, worker: WorkerProcess) -> None:
        """Its leases move on at their next request (``RemoteInstance``): nothing to do now."""
        if not self._closing and worker.held:
            log.warning("env %s: %s; its %d leases move to other workers", self.name,
                        worker.lost, len(worker.held))

    @asynccontextmanager
    async def quarantine(self, tenant: str) -> AsyncIterator[WorkerProcess]:
        """A fresh worker of ``tenant``'s that takes no other lease, held while one suspect
        request runs on it alone (the suspects of a lost worker take turns). Once no suspect
        waits, it takes leases like any worker of that tenant."""
        self._suspects[tenant] = self._suspects.get(tenant, 0) + 1
        try:
            async with self._ward_locks.setdefault(tenant, asyncio.Lock()):
                ward = self._wards.get(tenant)
                if ward is None or ward.lost is not None:
                    try:
                        ward = await self._started_worker()
                    except WorkerStartError as exc:
                        raise PoolExhausted(f"env {self.name!r}: a worker did not start "
                                            f"({exc}); retry", env=self.name) from None
                    ward.tenant = tenant
                    self._wards[tenant] = ward
                yield ward
        finally:
            self._suspects[tenant] -= 1
            if not self._suspects[tenant]:
                del self._suspects[tenant], self._ward_locks[tenant]
                self._wards.pop(tenant, None)

    async def _task_initial(self, worker: WorkerProcess, task: int) -> Template:
        """A task's starting database, as the worker builds it (once per task: the front runs no
        SQL of the env's own)."""
        if task not in self._task_initials:
            reply, data = await worker.request({"op": "task_initial", "task": task},
                                               self.options.deadline_grace_s + 5,
                                               cap=frames.MAX_DB_BYTES)
            if not reply.get("ok") or not data.startswith(_SQLITE_MAGIC):
                worker.kill("sent a malformed task database")
                raise WorkerLost(worker.lost or "killed")
            self._task_initials[task] = Template(data)
        return self._task_initials[task]

    @property
    def starting(self) -> int:
        """Workers starting now (operators, tests)."""
        return len(self._growing)

    async def _grow(self) -> None:
        """Wait for another worker. Waiting leases share the starts under way, and as many
        start at once as the waiting leases fill (up to ``MAX_STARTS_AT_ONCE``): a burst of
        leases on a fresh replica does not wait for its workers one by one."""
        self._waiting += 1
        try:
            room = 1 if self.per_lease else self.options.leases_per_worker
            wanted = min(MAX_STARTS_AT_ONCE, -(-self._waiting // room))
            while len(self._growing) < wanted:
                self._start_growing(another=True)
            done, _ = await asyncio.wait(self._growing, return_when=asyncio.FIRST_COMPLETED)
            next(iter(done)).result()  # a start that failed raises WorkerStartError here
        finally:
            self._waiting -= 1

    def _start_growing(self, another: bool = False) -> None:
        """A worker start, unless one is under way (``another``: regardless)."""
        if another or not self._growing:
            start = asyncio.ensure_future(self._started_worker())
            start.add_done_callback(self._grown)
            self._growing.add(start)

    def _grown(self, future: asyncio.Future) -> None:
        self._growing.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.warning("env %s: a worker did not start: %s", self.name, future.exception())

    async def _started_worker(self) -> WorkerProcess:
        spawning = asyncio.get_running_loop().run_in_executor(None, self._spawn)
        try:
            worker, _, _ = await asyncio.shield(spawning)
        except asyncio.CancelledError:  # the farm stops: the worker must not outlive it
            spawning.add_done_callback(_kill_spawned)
            raise
        await worker.attach()
        worker.on_lost = self._worker_lost
        self.workers.append(worker)
        self.started += 1
        self._watch()
        return worker

    def release(self, inst: RemoteInstance) -> None:
        """The lease is closed; its instance is dropped after its request in flight."""
        self.open_leases -= 1
        inst.close()

    def dropped(self, inst: RemoteInstance) -> None:
        """Tell the worker to drop a closed lease's instance (no request of it is in flight)."""
        worker = inst.worker
        self.unplace(inst)
        if worker.lost is not None:
            return
        if self.per_lease or (worker.draining and worker.leases == 0):
            # its module saw that lease / a timed-out call may still run there: not reused
            worker.kill("served its one lease" if self.per_lease else "drained")
            return
        try:
            worker.post({"op": "drop", "inst": inst.inst})
        except WorkerLost:
            return
        if worker.leases == 0:
            worker.idle_since = time.monotonic()
        self._retire_idle()

    def _retire_idle(self) -> None:
        """Stop workers that have held no lease for ``retire_idle_s`` (one that never held one:
        while the others keep ``warm`` free slots); look again when the next idle one is due."""
        self._retiring = None
        now, due = time.monotonic(), None
        for worker in list(self._live()):
            live = [w for w in self.workers if w.lost is None and w is not worker]
            if worker.leases or worker.idle_since is None or not live:
                continue
            if worker.tenant is None and sum(self.capacity - w.leases for w in live
                                             if self._has_room(w)) < max(self.warm, 1):
                continue
            left = worker.idle_since + self.options.retire_idle_s - now
            if left <= 0:
                worker.kill("retired (idle)")  # holds no lease: nothing is lost
            else:
                due = left if due is None else min(due, left)
        if due is not None:
            try:
                self._retiring = asyncio.get_running_loop().call_later(due, self._retire_idle)
            except RuntimeError:  # no loop here: the next release looks again
                pass

    # -- the CPU watch ---------------------------------------------------------------------
    def _watch(self) -> None:
        if self._watching is None and self.options.cpu_check_s and not self._closing:
            self._watching = asyncio.get_running_loop().call_later(
                self.options.cpu_check_s, self._look)

    def _look(self) -> None:
        self._watching = None
        self._cpu.look([w for w in self._live() if w.attached])
        if self._live():
            self._watch()

    # -- status and shutdown -----------------------------------------------------------------
    def pool_stats(self) -> PoolStats:
        return PoolStats(env=self.name, free=self.free_slots(), leased=self.leased(),
                         resetting=0, warm_target=self.warm, max_instances=self.max_instances,
                         workers=len(self._live()), workers_started=self.started)

    async def aclose(self) -> None:
        for start in list(self._growing):
            start.cancel()
        await asyncio.gather(*self._growing, return_exceptions=True)
        self.kill_all("farm shut down")

    def kill_all(self, reason: str) -> None:
        self._closing = True
        for timer in (self._retiring, self._watching):
            if timer is not None:
                timer.cancel()
        self._retiring = self._watching = None
        for worker in self.workers:
            worker.kill(reason)
        self.workers = []


def _kill_spawned(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result()[0].kill("farm shut down")
