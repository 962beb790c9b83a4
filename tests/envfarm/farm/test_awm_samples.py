"""The farm serves the real AWM samples unchanged (content_platform_1 complete, code_hosting_2
with an empty database, communication_messaging_1 with tables from its ORM)."""

from __future__ import annotations

from cluster.compose import compose_core
from envfarm.farm import FarmConfig, PoolConfig
from tests.envfarm.farm.conftest import farm_client

FIRST_FREE_TOOL = {"code_hosting_2": "get_current_user",
                   "communication_messaging_1": "search_emails",
                   "content_platform_1": "list_user_subscriptions"}
EXPECTED = {
    # An empty database: the env's code makes its current user on first use.
    "code_hosting_2": lambda res: res["user"]["username"] == "alice",
    # The sample data's 15 emails in the user's mailbox.
    "communication_messaging_1": lambda res: res["total"] == 15 and len(res["emails"]) > 0,
    "content_platform_1": lambda res: res["subscriptions"]
    and all(s["channel_name"] for s in res["subscriptions"]),
}


async def test_every_servable_awm_sample_leases_and_calls(awm_catalog):
    core = compose_core(FarmConfig(pool=PoolConfig(warm=1)), catalog=awm_catalog)
    assert set(core.env_names()) == set(awm_catalog.servable) == set(EXPECTED)
    async with farm_client(core) as client:
        for env in core.env_names():
            r = await client.post(f"/envs/{env}/leases", json={})
            assert r.status_code == 201, r.text
            info = r.json()
            auth = {"Authorization": f"Bearer {info['token']}"}
            tools = (await client.get(f"/envs/{env}/leases/{info['lease_id']}/tools",
                                      headers=auth)).json()
            assert tools, env
            # The first tool without required arguments answers with the env's own data.
            free = next(t["name"] for t in tools if not t["input_schema"].get("required"))
            assert free == FIRST_FREE_TOOL[env]
            r = await client.post(f"/envs/{env}/leases/{info['lease_id']}/call",
                                  headers=auth, json={"tool": free})
            assert r.status_code == 200 and r.json()["ok"] is True, r.text
            assert EXPECTED[env](r.json()["result"]), (env, r.json()["result"])
    listed = {e.name: e.served for e in core.summaries()}
    assert listed["content_platform_1"] is True and listed["e_commerce_33"] is False
