"""Many env types on Serve: one deployment, types loaded at first lease (issue 26)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fakes.catalog_1k import make_catalog
from envfarm.client import Farm
from envfarm.errors import EnvBroken
from tests.envfarm.serve.conftest import _start

pytestmark = pytest.mark.ray

TYPES = 20


@pytest.fixture(scope="module")
def many_types_farm(tmp_path_factory) -> Iterator[tuple[object, list[str]]]:
    from envfarm.farm import FarmConfig, PoolConfig, free_port
    from envfarm.serve import ServeOptions

    path = tmp_path_factory.mktemp("catalog_20")
    names = make_catalog(path, types=TYPES, broken=1)
    farm = _start(FarmConfig(catalog=str(path), pool=PoolConfig(warm=1)),
                  ServeOptions(port=free_port(), num_cpus=2))
    try:
        yield farm, names
    finally:
        farm.shutdown()


async def test_types_share_one_deployment_and_load_at_first_lease(many_types_farm):
    farm, names = many_types_farm
    assert [len(p.envs) for p in farm.plans] == [TYPES]  # not an application per type
    async with httpx.AsyncClient(base_url=farm.url) as http, Farm(farm.url) as sdk:
        status = (await http.get("/status.json")).json()["types"]
        assert (status["types"], status["loaded"], status["cold_starts"]) == (TYPES, 0, 0)
        async with sdk.lease(names[0]) as lease:
            tools = await lease.tools()
            res = await lease.call_result(tools[0].name, {})
            assert res.ok or res.error.kind == "agent_error"
        assert [d.state.value for d in await sdk.warm(names[1])] == ["loaded"]
        with pytest.raises(EnvBroken):
            await sdk.acquire(names[-1])
        status = (await http.get("/status.json")).json()["types"]
        assert (status["loaded"], status["broken"], status["cold_starts"]) == (2, 1, 2)
