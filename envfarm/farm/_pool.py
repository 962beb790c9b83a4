"""A pool of prefetched, reset instances of one env.

A released instance is reset in the background (under its lock, so an in-flight call finishes
first) and goes back to the free list; the pool tops itself up to ``warm`` free instances, so
acquiring never waits for a reset.
"""

from __future__ import annotations

import asyncio
from collections import deque

from envfarm.errors import PoolExhausted
from envfarm.farm._config import PoolConfig
from envfarm.wire import PoolStats
from envfarm.runtime import EnvRuntime, Instance


class InstancePool:
    """Free and leased instances of one ``EnvRuntime`` (one process or replica)."""

    def __init__(self, runtime: EnvRuntime, config: PoolConfig) -> None:
        self.runtime = runtime
        self.config = config
        self._free: deque[Instance] = deque()
        self._leased = 0
        self._resetting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.fill()

    @property
    def total(self) -> int:
        return len(self._free) + self._leased + self._resetting

    def fill(self) -> None:
        """Create fresh instances until ``warm`` are free (a new instance is one deserialize)."""
        while len(self._free) < self.config.warm and self.total < self.config.max_instances:
            self._free.append(self.runtime.instance())

    def acquire(self) -> Instance:
        if self._free:
            inst = self._free.popleft()
        elif self.total < self.config.max_instances:
            inst = self.runtime.instance()
        else:
            raise PoolExhausted(
                f"env {self.runtime.name!r}: all {self.config.max_instances} instances are leased; "
                "release some or raise max_instances", env=self.runtime.name,
                max_instances=self.config.max_instances)
        self._leased += 1
        if len(self._free) < self.config.warm:
            self._schedule_fill()
        return inst

    def _schedule_fill(self) -> None:
        try:
            asyncio.get_running_loop().call_soon(self.fill)
        except RuntimeError:
            self.fill()

    def release(self, inst: Instance) -> None:
        """Hand an instance back; it is reset in the background, then reused."""
        self._leased -= 1
        self._resetting += 1
        try:
            task = asyncio.get_running_loop().create_task(self._recycle(inst))
        except RuntimeError:  # no loop (sync shutdown paths): reset inline
            self._resetting -= 1
            self._put_back(inst)
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recycle(self, inst: Instance) -> None:
        try:
            async with inst.lock:
                self._put_back(inst)
        finally:
            self._resetting -= 1

    def _put_back(self, inst: Instance) -> None:
        if inst.closed:
            return
        # Keep at most twice the warm target idle; more only costs memory.
        if len(self._free) >= max(2 * self.config.warm, 1):
            inst.close()
            return
        inst.reset(self.runtime.template.data)  # a task's own start does not outlive its lease
        self._free.append(inst)

    def stats(self) -> PoolStats:
        return PoolStats(env=self.runtime.name, free=len(self._free), leased=self._leased,
                         resetting=self._resetting, warm_target=self.config.warm,
                         max_instances=self.config.max_instances)

    async def drain(self) -> None:
        """Finish background resets and close every free instance."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._free:
            self._free.popleft().close()
