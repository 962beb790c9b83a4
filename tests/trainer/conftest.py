"""Fixtures of the trainer tests: one in-process farm over the bundled catalog, the tiny model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster.compose import compose_core
from envfarm import EnvRuntime
from envfarm.client import ASGITransport, Farm
from envfarm.farm import FarmConfig, FarmCore, PoolConfig, build_app
from tests.envfarm.farm.conftest import lifespan_running


@pytest.fixture(scope="session")
def runtimes(bundled_catalog) -> dict[str, EnvRuntime]:
    return {name: EnvRuntime(bundled_catalog[name]) for name in bundled_catalog.servable}


@pytest.fixture
def farm_core(bundled_catalog, runtimes) -> FarmCore:
    return compose_core(FarmConfig(pool=PoolConfig(warm=2, max_instances=64),
                                   verifier_workers=2),
                        catalog=bundled_catalog, runtimes=runtimes)


@pytest.fixture
async def farm(farm_core) -> AsyncIterator[Farm]:
    app = build_app(farm_core)
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app)) as f:
        yield f


def leased(core: FarmCore) -> int:
    """Leases the farm holds right now (0 when every episode gave its lease back)."""
    return sum(stats.leased for stats in core.pool_stats())


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from trainer.tiny_model import tiny_model_path

    return tiny_model_path(cache_dir=tmp_path_factory.getbasetemp().parent / "envfarm-cache")
