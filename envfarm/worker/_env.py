"""One env type served from worker processes, as the front sees it.

``WorkerEnv`` loads the env in a first worker (its tools and initial database come back over
the channel), places leases' instances on workers (at most ``leases_per_worker`` each, so one
crash touches a bounded share), starts another worker before the free slots run out, and
stops idle ones. ``RemoteInstance`` is a lease's handle on its instance in a worker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from envfarm.errors import EnvLoadError, PoolExhausted
from envfarm.models import CallResult, EnvBundle, ToolSpec
from envfarm.wire import PoolStats
from envfarm.worker._process import WorkerLost, WorkerProcess, WorkerStartError
from envfarm.worker._spares import SpareWorkers

_SQLITE_MAGIC = b"SQLite format 3\x00"
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
    #: At load, find module-level state that tool calls change (``check.module_state_leaks``);
    #: such an env gets a fresh worker per lease.
    probe_module_state: bool = True

    def worker_config(self) -> dict[str, Any]:
        from envfarm.jail import worker_identity  # root: each worker gets a uid of its own

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
        first, reply, self.template = self._spawn(probe=probe)
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
        self._growing: asyncio.Task | None = None
        self.started = 1  # workers started over this env's life (replacements included)
        self._retiring: asyncio.TimerHandle | None = None

    def _spawn(self, probe: bool = False) -> tuple[WorkerProcess, dict[str, Any], bytes]:
        worker = (self.spares.take() if self.spares is not None
                  else WorkerProcess(self.options.worker_config(), stderr=self.options.stderr))
        load = {"op": "load", "bundle": self.bundle.model_dump(
                    mode="json", include={"name", "code", "db_schema", "sample_data",
                                          "api_spec"}),
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

    def _has_room(self, worker: WorkerProcess) -> bool:
        return (worker.leases < self.capacity and not worker.draining
                and not (self.per_lease and worker.placed))

    def free_slots(self) -> int:
        return sum(self.capacity - w.leases for w in self._live() if self._has_room(w))

    def leased(self) -> int:
        return sum(w.leases for w in self._live())

    async def acquire(self) -> RemoteInstance:
        while True:
            worker = next((w for w in self._live() if self._has_room(w)), None)
            if worker is None:
                if self.leased() >= self.max_instances:
                    raise PoolExhausted(
                        f"env {self.name!r}: all {self.max_instances} instances are leased; "
                        "release some or raise max_instances", env=self.name,
                        max_instances=self.max_instances)
                try:
                    await self._grow()
                except WorkerStartError as exc:
                    raise PoolExhausted(f"env {self.name!r}: no worker has room and a new one "
                                        f"did not start ({exc}); retry", env=self.name) from None
                continue
            worker.leases += 1  # the slot is taken before any await: no overbooking
            worker.placed += 1
            worker.idle_since = None
            try:
                await worker.attach()
                inst = RemoteInstance(self, worker, next(self._ids))
                worker.post({"op": "new", "inst": inst.inst})
                break
            except WorkerLost:  # it died meanwhile: place the lease on another worker
                worker.leases -= 1
        spare = min(self.warm, 2) if self.per_lease else self.warm  # a worker each: costly
        if self.free_slots() < spare:
            self._start_growing()  # ready before the free slots run out
        return inst

    async def _grow(self) -> None:
        """One more worker; concurrent callers share the start under way."""
        await asyncio.shield(self._start_growing())

    def _start_growing(self) -> asyncio.Future:
        if self._growing is None:
            self._growing = asyncio.ensure_future(self._start_worker())
            self._growing.add_done_callback(self._grown)
        return self._growing

    def _grown(self, future: asyncio.Future) -> None:
        self._growing = None
        if not future.cancelled() and future.exception() is not None:
            log.warning("env %s: a worker did not start: %s", self.name, future.exception())

    async def _start_worker(self) -> None:
        spawning = asyncio.get_running_loop().run_in_executor(None, self._spawn)
        try:
            worker, _, _ = await asyncio.shield(spawning)
        except asyncio.CancelledError:  # the farm stops: the worker must not outlive it
            spawning.add_done_callback(_kill_spawned)
            raise
        await worker.attach()
        self.workers.append(worker)
        self.started += 1

    def release(self, inst: RemoteInstance) -> None:
        worker = inst.worker
        worker.leases -= 1
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
        """Stop workers that have held no lease for ``retire_idle_s`` while the others keep
        ``warm`` free slots; look again when the next idle one is due."""
        self._retiring = None
        now, due = time.monotonic(), None
        for worker in list(self._live()):
            if worker.leases or worker.idle_since is None or len(self.workers) <= 1:
                continue
            others = sum(self.capacity - w.leases for w in self._live() if w is not worker)
            if others < max(self.warm, 1):
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

    # -- status and shutdown -----------------------------------------------------------------
    def pool_stats(self) -> PoolStats:
        return PoolStats(env=self.name, free=self.free_slots(), leased=self.leased(),
                         resetting=0, warm_target=self.warm, max_instances=self.max_instances,
                         workers=len(self._live()), workers_started=self.started)

    async def aclose(self) -> None:
        if self._growing is not None:
            self._growing.cancel()
            await asyncio.gather(self._growing, return_exceptions=True)
        self.kill_all("farm shut down")

    def kill_all(self, reason: str) -> None:
        if self._retiring is not None:
            self._retiring.cancel()
            self._retiring = None
        for worker in self.workers:
            worker.kill(reason)
        self.workers = []


def _kill_spawned(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result()[0].kill("farm shut down")


class RemoteInstance:
    """A lease's instance, living in a worker; calls on it run one at a time."""

    __slots__ = ("env", "worker", "inst", "_lock")

    def __init__(self, env: WorkerEnv, worker: WorkerProcess, inst: int) -> None:
        self.env = env
        self.worker = worker
        self.inst = inst
        # Queued behind this lease's own calls in the front, not in the worker: the deadline
        # starts when the worker starts the call, so one lease's burst cannot kill the worker.
        self._lock = asyncio.Lock()

    @property
    def tools(self) -> list[ToolSpec]:
        return self.env.tools

    @property
    def lost(self) -> str | None:
        return self.worker.lost

    def initial_snapshot(self) -> bytes:
        return self.env.template

    async def _ask(self, header: dict[str, Any], timeout_s: float, payload: bytes = b""
                   ) -> tuple[dict, bytes]:
        async with self._lock:
            reply, payload = await self.worker.request(dict(header, inst=self.inst), timeout_s,
                                                       payload)
        if not reply.get("ok"):
            self.worker.kill(f"could not serve instance {self.inst}: {reply.get('error')}")
            raise WorkerLost(self.worker.lost)
        return reply, payload

    async def call(self, tool: str, arguments: Any) -> CallResult:
        _, payload = await self._ask({"op": "call", "tool": tool, "args": arguments},
                                     self.env.call_deadline_s)
        try:
            return CallResult.model_validate_json(payload)
        except ValidationError:
            self.worker.kill("sent a malformed call result")
            raise WorkerLost(self.worker.lost) from None

    async def reset(self) -> None:
        await self._ask({"op": "reset"}, self.env.options.deadline_grace_s + 5)

    async def snapshot(self) -> bytes:
        _, data = await self._ask({"op": "snapshot"}, self.env.options.deadline_grace_s + 5)
        if not data.startswith(_SQLITE_MAGIC):
            self.worker.kill("sent a malformed database image")
            raise WorkerLost(self.worker.lost)
        return data

    async def restore(self, data: bytes) -> None:
        """Take another instance's state (a fork); ``EnvLoadError`` if the worker cannot read
        it (the instance stays fresh)."""
        if not data.startswith(_SQLITE_MAGIC):
            raise EnvLoadError(f"env {self.env.name!r}: not a database image", env=self.env.name)
        reply, _ = await self._ask({"op": "restore"}, self.env.options.deadline_grace_s + 5,
                                   payload=data)
        self._restored(reply)

    async def copy_from(self, other: RemoteInstance) -> None:
        """Take ``other``'s state now (a fork): inside the worker when both live in the same one
        (no bytes cross the channel), else through the front."""
        if other.worker is not self.worker:
            await self.restore(await other.snapshot())
            return
        async with other._lock:  # after the parent's calls already sent, before its next ones
            reply, _ = await self._ask({"op": "clone", "src": other.inst},
                                       self.env.options.deadline_grace_s + 5)
        self._restored(reply)

    def _restored(self, reply: dict[str, Any]) -> None:
        if not reply.get("restored"):
            raise EnvLoadError(f"env {self.env.name!r}: the worker could not restore the "
                               f"state ({str(reply.get('error'))[:200]})", env=self.env.name)

