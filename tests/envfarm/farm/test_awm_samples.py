"""The farm serves the real AWM samples unchanged (content_platform_1 complete, code_hosting_2
with an empty database, communication_messaging_1 with tables from its ORM)."""

from __future__ import annotations

from envfarm.compose import compose_core
from envfarm.farm import FarmConfig, PoolConfig
from tests.envfarm.farm.conftest import farm_client


async def test_every_servable_awm_sample_leases_and_calls(awm_catalog):
    core = compose_core(FarmConfig(pool=PoolConfig(warm=1)), catalog=awm_catalog)
    assert set(core.env_names()) == set(awm_catalog.servable)
    async with farm_client(core) as client:
        for env in core.env_names():
            r = await client.post(f"/envs/{env}/leases", json={})
            assert r.status_code == 201, r.text
            info = r.json()
            auth = {"Authorization": f"Bearer {info['token']}"}
            tools = (await client.get(f"/envs/{env}/leases/{info['lease_id']}/tools",
                                      headers=auth)).json()
            assert tools, env
            # The first tool without required arguments must answer, whatever the data.
            free = next((t for t in tools if not t["input_schema"].get("required")), None)
            if free is not None:
                r = await client.post(f"/envs/{env}/leases/{info['lease_id']}/call",
                                      headers=auth, json={"tool": free["name"]})
                assert r.status_code == 200
                assert r.json()["ok"] or r.json()["error"]["kind"] in ("agent_error",
                                                                       "env_error")
    listed = {e.name: e.served for e in core.summaries()}
    assert listed["content_platform_1"] is True and listed["e_commerce_33"] is False
