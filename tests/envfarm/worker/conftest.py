"""A farm of real, jailed env workers serving hostile, careless and plain envs."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from envfarm.catalog import Catalog
from envfarm.compose import LocalFarm
from envfarm.farm import FarmConfig, PoolConfig
from tests.fakes.toy_env import toy_bundle
from tests.envfarm.worker.hostile_env import HOSTILE, with_code

SECRET = "front-secret-7f3a9c"


def catalog(**codes: str) -> Catalog:
    bundles = {name: toy_bundle(code).model_copy(update={"name": name})
               for name, code in codes.items()}
    return Catalog(bundles, [], Path("."))


@pytest.fixture(scope="module")
def secret_env():
    """The front holds a secret in its environment, as a farm with API keys does."""
    os.environ["ENVFARM_TEST_FRONT_SECRET"] = SECRET
    yield SECRET
    os.environ.pop("ENVFARM_TEST_FRONT_SECRET", None)


def start_farm(codes: dict[str, str], **config) -> LocalFarm:
    config.setdefault("pool", PoolConfig(warm=2))
    return LocalFarm(FarmConfig(**config), catalog=catalog(**codes)).start(timeout_s=120)


@pytest.fixture(scope="module")
def hostile_farm(secret_env):
    farm = start_farm({"hostile": with_code(HOSTILE), "victim": with_code("")},
                      call_timeout_s=2.0, leases_per_worker=4, check_module_state=False)
    yield farm
    farm.stop()


@pytest.fixture
async def http(farm):
    """An async client of the module's ``farm`` (each module that uses it defines ``farm``)."""
    async with httpx.AsyncClient(base_url=farm.url, timeout=120,
                                 limits=httpx.Limits(max_connections=500)) as client:
        yield client
