"""Fixtures of the farm tests: one compiled env shared by many small in-process farms."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from cluster.compose import compose_core
from envfarm import EnvRuntime
from envfarm.farm import FarmConfig, FarmCore, LeasePolicy, PoolConfig, build_app

ENV = "hotel_booking_1"


@pytest.fixture(scope="session")
def hotel_runtime(bundled_catalog) -> EnvRuntime:
    return EnvRuntime(bundled_catalog[ENV])


@pytest.fixture
def make_core(bundled_catalog, hotel_runtime) -> Callable[..., FarmCore]:
    def make(**overrides) -> FarmCore:
        config = FarmConfig(envs=[ENV], pool=overrides.pop("pool", PoolConfig(warm=2)),
                            leases=overrides.pop("leases", LeasePolicy()), **overrides)
        return compose_core(config, catalog=bundled_catalog, runtimes={ENV: hotel_runtime})
    return make


@pytest.fixture
async def core(make_core) -> FarmCore:
    return make_core()


@asynccontextmanager
async def lifespan_running(app) -> AsyncIterator[None]:
    """Run the app's lifespan in a task of its own: its anyio task groups must be entered and
    exited by one task, and pytest-asyncio sets up and tears down fixtures in different ones."""
    started, stop = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with app.router.lifespan_context(app):
            started.set()
            await stop.wait()

    task = asyncio.create_task(hold())
    await asyncio.wait([task, asyncio.ensure_future(started.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # start-up failed: raise it
    try:
        yield
    finally:
        stop.set()
        await task


@asynccontextmanager
async def farm_client(core) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(core)
    async with lifespan_running(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://farm") as c:
        yield c


@pytest.fixture
async def client(core) -> AsyncIterator[httpx.AsyncClient]:
    """The lease API app in-process, lifespan running."""
    async with farm_client(core) as c:
        yield c


async def new_lease(client: httpx.AsyncClient, **body) -> tuple[str, dict[str, str], dict]:
    """(lease path, auth headers, lease info)."""
    r = await client.post(f"/envs/{ENV}/leases", json=body)
    assert r.status_code == 201, r.text
    info = r.json()
    return (f"/envs/{ENV}/leases/{info['lease_id']}",
            {"Authorization": f"Bearer {info['token']}"}, info)
