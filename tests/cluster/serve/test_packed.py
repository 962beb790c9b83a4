"""Several env types packed into one deployment (small machines): every API path still works."""

from __future__ import annotations

import pytest

from envfarm.client import Farm, LeaseLost, reference_episode

pytestmark = pytest.mark.ray


async def test_packed_envs_serve_episodes_mcp_and_batches(packed_farm, bundled_catalog):
    from fastmcp import Client
    from fastmcp.client.transports import StreamableHttpTransport

    assert len(packed_farm.plans) == 1 and len(packed_farm.plans[0].envs) == 3
    async with Farm(packed_farm.url) as farm:
        for env in bundled_catalog.servable:
            report = await reference_episode(farm, env, 2, bundled_catalog[env].solutions[2])
            assert report.verdict.reward == 1.0, (env, report.verdict)
        leases = [await farm.acquire(env) for env in bundled_catalog.servable for _ in range(3)]
        assert len({lease.lease_id.split("-")[0] for lease in leases}) == 2
        # One batch across the three packed envs: each call reaches its own env's data.
        profile = {"hotel_booking_1": ("get_my_profile", lambda r: r["username"]),
                   "personal_banking_1": ("get_my_profile", lambda r: r["user"]["username"]),
                   "project_management_1": ("get_current_user", lambda r: r["username"])}
        firsts = leases[::3]
        out = await farm.batch_call([(lease, profile[lease.env][0], {}) for lease in firsts])
        assert all(getattr(r, "ok", False) for r in out), out
        assert [profile[lease.env][1](r.result) for lease, r in zip(firsts, out)] == [
            "emma.larsen", "elena.reyes", "maya.chen"]
        lease = leases[0]
        transport = StreamableHttpTransport(lease.mcp_url,
                                            headers={"Authorization": f"Bearer {lease.token}"})
        async with Client(transport) as mcp:
            assert len(await mcp.list_tools()) == len(await lease.tools())
        detail = await farm.env(lease.env)
        assert detail.tools and detail.pool is not None
        for lease in leases:
            await lease.release()
        with pytest.raises(LeaseLost):
            await leases[0].tools()
