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
        out = await farm.batch_call([(lease, (await lease.tools())[0].name, {})
                                     for lease in leases[:1]])
        assert out[0].ok or out[0].error.kind == "agent_error"
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
