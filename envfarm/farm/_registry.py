"""Which env types a farm process serves, and which of them are loaded right now.

Every served type is addressable; an on-demand type costs nothing until its first lease (or a
warm-up): then its first worker starts and loads it (a cold start, shared by every request that
arrives meanwhile). A type with no lease for ``evict_idle_s`` is evicted: its workers stop and
their memory goes back to the machine. A type whose load fails is marked broken and answers
``EnvBroken`` from then on; the other types keep serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from envfarm.errors import EnvBroken, EnvLoadError
from envfarm.farm._served import ServedEnv
from envfarm.wire import EnvState, TypeCounts

log = logging.getLogger("envfarm.farm")

#: Cold starts that run at once; more would only share the same 2-16 cores more thinly.
LOAD_THREADS = 4


class EnvRegistry:
    """The served types of one process: loaded, loading, cold or broken."""

    def __init__(self, names: list[str], load: Callable[[str], ServedEnv], *,
                 loaded: dict[str, ServedEnv], on_demand: bool, hot: list[str],
                 evict_idle_s: float, problems: list[str]) -> None:
        """``problems``: the farm's list, where broken types are reported."""
        self.names = set(names)
        self.loaded = loaded
        self.on_demand = on_demand
        self.hot = set(hot)
        self.evict_idle_s = evict_idle_s
        self.broken: dict[str, str] = {}
        self.problems = problems
        self.cold_starts = 0
        self.evictions = 0
        self._load = load
        self._loading: dict[str, asyncio.Task[ServedEnv]] = {}
        self._last_used: dict[str, float] = dict.fromkeys(loaded, time.monotonic())
        self._pins: Counter[str] = Counter()  # lease creations under way (not evictable)
        self._threads = ThreadPoolExecutor(max_workers=LOAD_THREADS,
                                           thread_name_prefix="envfarm-cold")

    def state(self, name: str) -> EnvState:
        if name in self.loaded:
            return EnvState.loaded
        if name in self.broken:
            return EnvState.broken
        return EnvState.loading if name in self._loading else EnvState.cold

    def counts(self) -> TypeCounts:
        return TypeCounts(types=len(self.names), loaded=len(self.loaded),
                          loading=len(self._loading), broken=len(self.broken),
                          cold=len(self.names) - len(self.loaded) - len(self._loading)
                          - len(self.broken),
                          cold_starts=self.cold_starts, evictions=self.evictions)

    async def get(self, name: str) -> ServedEnv:
        """The loaded env, cold-starting it if needed (``EnvBroken`` if it does not load)."""
        served = self.loaded.get(name)
        if served is None:
            if name in self.broken:
                raise EnvBroken(f"env {name!r} is broken: {self.broken[name]}", env=name)
            task = self._loading.get(name)
            if task is None:
                task = asyncio.ensure_future(self._cold_start(name))
                self._loading[name] = task
            served = await asyncio.shield(task)
        self._last_used[name] = time.monotonic()
        return served

    async def _cold_start(self, name: str) -> ServedEnv:
        try:
            served = await asyncio.get_running_loop().run_in_executor(
                self._threads, self._load, name)
        except EnvLoadError as exc:
            self.broken[name] = exc.message
            self.problems.append(f"{name}: {exc.message}")
            log.warning("env %s is broken: %s", name, exc.message)
            raise EnvBroken(exc.message, env=name) from None
        finally:
            self._loading.pop(name, None)
        self.loaded[name] = served
        self._last_used[name] = time.monotonic()
        self.cold_starts += 1
        return served

    def pin(self, name: str) -> None:
        self._pins[name] += 1

    def unpin(self, name: str) -> None:
        self._pins[name] -= 1
        if self._pins[name] <= 0:
            del self._pins[name]
        self.touch(name)

    def touch(self, name: str) -> None:
        self._last_used[name] = time.monotonic()

    def idle(self, now: float | None = None) -> list[str]:
        """Loaded on-demand types with no lease (and none being made) for ``evict_idle_s``."""
        if not self.on_demand:
            return []
        now = time.monotonic() if now is None else now
        return [name for name, served in self.loaded.items()
                if name not in self.hot and not self._pins[name]
                and served.pool_stats().leased == 0
                and now - self._last_used.get(name, now) >= self.evict_idle_s]

    async def evict_idle(self, now: float | None = None) -> list[str]:
        """Evict idle types (their workers stop); returns their names."""
        names = self.idle(now)
        for name in names:
            served = self.loaded.pop(name)
            self.evictions += 1
            await served.aclose()
        return names

    async def aclose(self) -> None:
        """Waits for cold starts under way (so no worker outlives the farm), then stops all."""
        await asyncio.gather(*self._loading.values(), return_exceptions=True)
        for served in self.loaded.values():
            await served.aclose()
        self._threads.shutdown(wait=False)
