"""A synchronous wrapper over the async SDK, for scripts (not for code in an event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self, TypeVar

from envfarm.client._client import Farm, Lease
from envfarm.models import CallResult, ToolSpec
from envfarm.wire import (
    EnvDetail,
    EnvSummary,
    QuarantinedTask,
    ReleaseResponse,
    VerifyResponse,
)

T = TypeVar("T")


class SyncFarm:
    """``Farm`` with blocking methods; owns a private event loop."""

    def __init__(self, url: str = "http://127.0.0.1:8000", **options: Any) -> None:
        _refuse_in_loop()
        self._runner = asyncio.Runner()
        self._farm = self._runner.run(_make(url, options))

    def _run(self, coro: Any) -> Any:
        _refuse_in_loop()
        return self._runner.run(coro)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._run(self._farm.aclose())
        self._runner.close()

    def envs(self) -> list[EnvSummary]:
        return self._run(self._farm.envs())

    def env(self, name: str) -> EnvDetail:
        return self._run(self._farm.env(name))

    def warm(self, *names: str) -> list[EnvDetail]:
        return self._run(self._farm.warm(*names))

    def quarantined(self) -> list[QuarantinedTask]:
        return self._run(self._farm.quarantined())

    def lift_quarantine(self, env: str, task_idx: int | None = None) -> list[QuarantinedTask]:
        return self._run(self._farm.lift_quarantine(env, task_idx))

    def acquire(self, env: str, **kw: Any) -> SyncLease:
        return SyncLease(self, self._run(self._farm.acquire(env, **kw)))

    @contextmanager
    def lease(self, env: str, **kw: Any) -> Iterator[SyncLease]:
        lease = self.acquire(env, **kw)
        try:
            yield lease
        finally:
            lease.release()


class SyncLease:
    def __init__(self, farm: SyncFarm, lease: Lease) -> None:
        self._farm = farm
        self.lease = lease

    @property
    def lease_id(self) -> str:
        return self.lease.lease_id

    @property
    def token(self) -> str:
        return self.lease.token

    def tools(self) -> list[ToolSpec]:
        return self._farm._run(self.lease.tools())

    def call(self, tool: str, arguments: dict[str, Any] | None = None) -> Any:
        return self._farm._run(self.lease.call(tool, arguments))

    def call_result(self, tool: str, arguments: dict[str, Any] | None = None) -> CallResult:
        return self._farm._run(self.lease.call_result(tool, arguments))

    def reset(self) -> None:
        self._farm._run(self.lease.reset())

    def fork(self, ttl_s: float | None = None) -> SyncLease:
        return SyncLease(self._farm, self._farm._run(self.lease.fork(ttl_s)))

    def verify(self, task_idx: int | None = None, final_answer: str | None = None,
               trajectory: Any = None) -> VerifyResponse:
        return self._farm._run(self.lease.verify(task_idx, final_answer, trajectory))

    def release(self) -> ReleaseResponse | None:
        if self.lease.released:
            return None
        try:
            return self._farm._run(self.lease.release())
        except Exception:  # noqa: BLE001 - releasing a lost lease is not an error for scripts
            return None


async def _make(url: str, options: dict[str, Any]) -> Farm:
    return Farm(url, **options)  # its HTTP client must be made inside the runner's loop


def _refuse_in_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError("SyncFarm cannot run inside a running event loop; use envfarm.client.Farm")
