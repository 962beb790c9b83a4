"""Which env types a farm process serves, and which of them are loaded right now.

Every served type is addressable; an on-demand type costs nothing until its first lease (or a
warm-up): then its first worker starts and loads it (a cold start, shared by every request that
arrives meanwhile). A type with no lease for ``evict_idle_s`` is evicted: its workers stop and
their memory goes back to the machine. At most ``max_loaded`` types are loaded (or loading) at
once: a cold start beyond the cap first evicts the least recently used type that holds no
lease, and is refused (``TooManyTypesLoaded``) when every loaded type is in use. A type whose
load fails is marked broken and answers ``EnvBroken`` (with ``retry_after_s``) until its load
is tried again: after a backoff that doubles with each failure, or at once when the catalog
changed on disk. The other types keep serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from envfarm.errors import EnvBroken, EnvLoadError, TooManyTypesLoaded
from envfarm.farm._served import ServedEnv
from envfarm.wire import EnvState, TypeCounts

log = logging.getLogger("envfarm.farm")

#: Cold starts that run at once; more would only share the same 2-16 cores more thinly.
LOAD_THREADS = 4
#: The longest a broken type waits before its load is tried again.
MAX_RETRY_S = 3600.0
#: What a request refused at the cap is told to wait: about one lease's episode turn.
CAP_RETRY_AFTER_S = 5.0


@dataclass
class Broken:
    """A type whose last load failed: why, how often in a row, and when to try again."""

    message: str
    failures: int
    retry_at: float  # time.monotonic()

    def retry_after_s(self, now: float) -> float:
        return max(0.0, round(self.retry_at - now, 3))


class EnvRegistry:
    """The served types of one process: loaded, loading, cold or broken."""

    def __init__(self, names: list[str], load: Callable[[str], ServedEnv], *,
                 loaded: dict[str, ServedEnv], on_demand: bool, hot: list[str],
                 evict_idle_s: float, problems: list[str], max_loaded: int | None = None,
                 retry_s: float = 60.0,
                 catalog_changed: Callable[[str], bool] = lambda name: False) -> None:
        """``problems``: the farm's list, where broken types are reported. ``max_loaded``:
        the cap on loaded + loading types (None: none). ``retry_s``: the first backoff of a
        broken type. ``catalog_changed(name)``: whether the catalog on disk changed since
        ``name`` was read (its load is then retried at once)."""
        self.names = set(names)
        self.loaded = loaded
        self.on_demand = on_demand
        self.hot = set(hot)
        self.evict_idle_s = evict_idle_s
        self.max_loaded = max_loaded if on_demand else None
        self.retry_s = retry_s
        self.broken: dict[str, Broken] = {}
        self.problems = problems
        self.cold_starts = 0
        self.evictions = 0
        self.evicted_for_room = 0
        self.refused_at_cap = 0
        self.broken_retries = 0
        self._load = load
        self._catalog_changed = catalog_changed
        self._loading: dict[str, asyncio.Task[ServedEnv]] = {}
        self._last_used: dict[str, float] = dict.fromkeys(loaded, time.monotonic())
        self._pins: Counter[str] = Counter()  # lease creations under way (not evictable)
        self._threads = ThreadPoolExecutor(max_workers=LOAD_THREADS,
                                           thread_name_prefix="envfarm-cold")

    def state(self, name: str) -> EnvState:
        if name in self.loaded:
            return EnvState.loaded
        if name in self._loading:
            return EnvState.loading
        return EnvState.broken if name in self.broken else EnvState.cold

    def counts(self) -> TypeCounts:
        broken = len(self.broken.keys() - self._loading.keys())
        return TypeCounts(types=len(self.names), loaded=len(self.loaded),
                          loading=len(self._loading), broken=broken,
                          cold=len(self.names) - len(self.loaded) - len(self._loading) - broken,
                          cold_starts=self.cold_starts, evictions=self.evictions,
                          max_loaded=self.max_loaded or 0,
                          evicted_for_room=self.evicted_for_room,
                          refused_at_cap=self.refused_at_cap,
                          broken_retries=self.broken_retries)

    async def get(self, name: str) -> ServedEnv:
        """The loaded env, cold-starting it if needed: ``EnvBroken`` if it does not load (or
        is backing off after failing), ``TooManyTypesLoaded`` at the cap with none idle."""
        served = self.loaded.get(name)
        if served is None:
            task = self._loading.get(name)
            if task is None:
                self._check_broken(name)
                victims = self._make_room()
                task = asyncio.ensure_future(self._cold_start(name, victims))
                self._loading[name] = task
            served = await asyncio.shield(task)
        self._last_used[name] = time.monotonic()
        return served

    def _check_broken(self, name: str) -> None:
        """Raise while a broken type backs off; let its load be tried again after that."""
        mark = self.broken.get(name)
        if mark is None:
            return
        now = time.monotonic()
        if now < mark.retry_at and not self._catalog_changed(name):
            raise EnvBroken(f"env {name!r} is broken: {mark.message} (failed {mark.failures}x; "
                            f"its load is tried again in {mark.retry_after_s(now):g} s, or "
                            "once the catalog changes)", env=name,
                            retry_after_s=mark.retry_after_s(now))
        self.broken_retries += 1

    def _make_room(self) -> list[ServedEnv]:
        """Under the cap, take the least recently used idle types out of ``loaded`` (their
        workers are stopped by the cold start that needed the room); refuse if none is idle.
        Synchronous, so concurrent cold starts cannot both take the last place."""
        if self.max_loaded is None:
            return []
        excess = len(self.loaded) + len(self._loading) + 1 - self.max_loaded
        if excess <= 0:
            return []
        idle = sorted(self._evictable(), key=lambda n: self._last_used.get(n, 0.0))
        if len(idle) < excess:
            self.refused_at_cap += 1
            raise TooManyTypesLoaded(
                f"this farm process has its cap of {self.max_loaded} env types loaded and every "
                "one of them has leases: release some, or raise --max-loaded",
                loaded=len(self.loaded) + len(self._loading), max_loaded=self.max_loaded,
                retry_after_s=CAP_RETRY_AFTER_S)
        self.evicted_for_room += excess
        log.info("evicting %s: the cap of %d loaded types is reached", ", ".join(idle[:excess]),
                 self.max_loaded)
        return [self._take_out(n) for n in idle[:excess]]

    def _evictable(self) -> list[str]:
        """Loaded on-demand types that hold no lease and have none being made."""
        return [name for name, served in self.loaded.items()
                if name not in self.hot and not self._pins[name]
                and served.pool_stats().leased == 0]

    def _take_out(self, name: str) -> ServedEnv:
        self.evictions += 1
        self._last_used.pop(name, None)
        return self.loaded.pop(name)

    async def _cold_start(self, name: str, victims: list[ServedEnv]) -> ServedEnv:
        try:
            for served in victims:  # their memory goes back before the new type's load
                await served.aclose()
            served = await asyncio.get_running_loop().run_in_executor(
                self._threads, self._load, name)
        except EnvLoadError as exc:
            raise self._mark_broken(name, exc.message) from None
        finally:
            self._loading.pop(name, None)
        if self.broken.pop(name, None) is not None:
            self.problems[:] = [p for p in self.problems if not p.startswith(f"{name}: ")]
            log.warning("env %s loads again", name)
        self.loaded[name] = served
        self._last_used[name] = time.monotonic()
        self.cold_starts += 1
        return served

    def _mark_broken(self, name: str, message: str) -> EnvBroken:
        before = self.broken.get(name)
        failures = before.failures + 1 if before else 1
        delay = min(self.retry_s * 2 ** (failures - 1), MAX_RETRY_S)
        self.broken[name] = Broken(message, failures, time.monotonic() + delay)
        if before is None:
            self.problems.append(f"{name}: {message}")
        log.warning("env %s is broken (failure %d; retried in %g s): %s", name, failures,
                    delay, message)
        return EnvBroken(message, env=name, retry_after_s=delay)

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
        return [name for name in self._evictable()
                if now - self._last_used.get(name, now) >= self.evict_idle_s]

    async def evict_idle(self, now: float | None = None) -> list[str]:
        """Evict idle types (their workers stop); returns their names."""
        names = self.idle(now)
        for name in names:
            await self._take_out(name).aclose()
        return names

    async def aclose(self) -> None:
        """Waits for cold starts under way (so no worker outlives the farm), then stops all."""
        await asyncio.gather(*self._loading.values(), return_exceptions=True)
        for served in self.loaded.values():
            await served.aclose()
        self._threads.shutdown(wait=False)
