"""The envs a farm core serves, behind one small interface, in one of two isolations.

- ``workers`` (the default): env code runs in confined worker processes
  (``envfarm.worker.WorkerEnv`` implements ``ServedEnv``);
  this process holds tokens, sockets, leases and verdicts and never executes generated code.
- ``in_process``: env code runs here, guarded only by in-process hooks. For catalogs you wrote
  or reviewed yourself, and as the baseline the benchmarks compare the boundary against.

Both hand out instance handles with the same async surface: ``call``, ``reset``, ``snapshot``,
``restore``/``copy_from`` (a fork), ``initial_snapshot``, ``tools`` and ``lost`` (why its
state is gone, or None).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Protocol

from envfarm.errors import EnvLoadError
from envfarm.farm._config import PoolConfig
from envfarm.farm._pool import InstancePool
from envfarm.models import CallResult, EnvBundle, ToolSpec
from envfarm.runtime import EnvRuntime, Instance
from envfarm.wire import PoolStats


class InstanceHandle(Protocol):
    tools: list[ToolSpec]
    lost: str | None

    async def call(self, tool: str, arguments: Any) -> CallResult: ...
    async def reset(self) -> None: ...
    async def snapshot(self) -> bytes: ...
    async def restore(self, data: bytes) -> None: ...
    async def copy_from(self, other: Any) -> None: ...
    def initial_snapshot(self) -> bytes: ...


class ServedEnv(Protocol):
    name: str
    bundle: EnvBundle
    tools: list[ToolSpec]
    problems: list[str]
    isolation: str
    #: The env app's OpenAPI as fastapi-mcp generates it (MCP listings), or None.
    openapi: dict[str, Any] | None

    async def acquire(self, tenant: str, task_idx: int | None = None) -> InstanceHandle:
        """An instance for a new lease of ``tenant`` (env code one tenant's calls run never
        shares a process with another tenant's instances), starting from the template or from
        task ``task_idx``'s own database (``EnvBundle.task_states``)."""
    def release(self, inst: InstanceHandle) -> None: ...
    def pool_stats(self) -> PoolStats: ...
    async def aclose(self) -> None: ...


class LocalInstance:
    """An in-process instance as a handle."""

    __slots__ = ("inst",)
    lost = None

    def __init__(self, inst: Instance) -> None:
        self.inst = inst

    @property
    def tools(self) -> list[ToolSpec]:
        return self.inst.tools

    @property
    def lock(self):
        """The instance's lock: held while a call, reset or snapshot runs on it."""
        return self.inst.lock

    async def call(self, tool: str, arguments: Any) -> CallResult:
        return await self.inst.call(tool, arguments)

    async def reset(self) -> None:
        async with self.inst.lock:
            self.inst.reset()

    async def snapshot(self) -> bytes:
        async with self.inst.lock:
            return self.inst.snapshot()

    async def copy_from(self, other: LocalInstance) -> None:
        await self.restore(await other.snapshot())

    async def restore(self, data: bytes) -> None:
        async with self.inst.lock:
            try:
                self.inst.restore(data)
            except sqlite3.DatabaseError as exc:
                raise EnvLoadError(f"env {self.inst.runtime.name!r}: cannot restore the state "
                                   f"({exc})", env=self.inst.runtime.name) from None

    def initial_snapshot(self) -> bytes:
        return self.inst.initial_snapshot()


class LocalEnv:
    """An env whose code runs in this process (trusted catalogs, baselines)."""

    isolation = "in_process"

    def __init__(self, runtime: EnvRuntime, config: PoolConfig) -> None:
        self.runtime = runtime
        self.name = runtime.name
        self.bundle = runtime.bundle
        self.tools = runtime.tools
        self.problems = runtime.problems
        self.pool = InstancePool(runtime, config)
        try:
            self.openapi = runtime.mcp_openapi()
        except Exception:  # noqa: BLE001 - generated code's schema may not render
            self.openapi = None

    async def acquire(self, tenant: str = "", task_idx: int | None = None) -> LocalInstance:
        """(In-process: the env's code is trusted, tenants share the pool.)"""
        inst = self.pool.acquire()
        if self.bundle.task_states.get(task_idx):  # the task's own start (EnvFactory's scenarios)
            inst.reset(self.runtime.task_initial(task_idx))
        return LocalInstance(inst)

    def release(self, inst: LocalInstance) -> None:
        self.pool.release(inst.inst)

    def pool_stats(self) -> PoolStats:
        return self.pool.stats()

    async def aclose(self) -> None:
        await self.pool.drain()
