"""MCP per lease over real HTTP, with two stock clients: fastmcp's and the official SDK's."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from cluster.compose import LocalFarm
from envfarm.farm import FarmConfig, PoolConfig
from tests.envfarm.farm.conftest import ENV


@pytest.fixture(scope="module")
def farm(bundled_catalog) -> Iterator[LocalFarm]:
    with LocalFarm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2))) as running:
        yield running


@pytest.fixture
def lease(farm) -> Iterator[dict]:
    with httpx.Client(base_url=farm.url) as c:
        info = c.post(f"/envs/{ENV}/leases", json={}).json()
        yield info
        c.delete(f"/envs/{ENV}/leases/{info['lease_id']}",
                 headers={"Authorization": f"Bearer {info['token']}"})


def wishlists(farm: LocalFarm, info: dict) -> set[str]:
    r = httpx.post(f"{farm.url}/envs/{ENV}/leases/{info['lease_id']}/call",
                   headers={"Authorization": f"Bearer {info['token']}"},
                   json={"tool": "list_wishlists"})
    return {w["name"] for w in r.json()["result"]["wishlists"]}


def fast_calls(farm: LocalFarm) -> int:
    """tools/call answered by the fast path so far (envfarm.farm._fastpath)."""
    return farm.server.config.app.state.mcp.fast_calls


async def test_fastmcp_client_drives_a_lease(farm, lease):
    from fastmcp import Client
    from fastmcp.client.transports import StreamableHttpTransport

    transport = StreamableHttpTransport(lease["mcp_url"],
                                        headers={"Authorization": f"Bearer {lease['token']}"})
    fast_before = fast_calls(farm)
    async with Client(transport) as client:
        tools = await client.list_tools()
        assert "create_wishlist" in {t.name for t in tools}
        result = await client.call_tool("create_wishlist", {"name": "via-fastmcp"})
        assert not result.is_error
        assert result.structured_content["name"] == "via-fastmcp"
        bad = await client.call_tool("get_reservation", {"reservation_id": 99999},
                                     raise_on_error=False)
        assert bad.is_error and "agent_error" in bad.content[0].text
        unknown = await client.call_tool("no_such_tool", {}, raise_on_error=False)
        assert unknown.is_error  # FastMCP's own answer (not a tool of this env)
    assert "via-fastmcp" in wishlists(farm, lease)
    assert fast_calls(farm) == fast_before + 2  # both tool calls took the fast path


async def test_official_mcp_sdk_drives_a_lease(farm, lease):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {lease['token']}"})
    url = lease["mcp_url"]
    fast_before = fast_calls(farm)
    async with http, streamable_http_client(url, http_client=http) as streams, ClientSession(
            streams[0], streams[1]) as session:
        await session.initialize()
        tools = await session.list_tools()
        assert "list_wishlists" in {t.name for t in tools.tools}
        res = await session.call_tool("create_wishlist", {"name": "via-mcp-sdk"})
        assert not res.is_error
        assert json.loads(res.content[0].text)["name"] == "via-mcp-sdk"
    assert "via-mcp-sdk" in wishlists(farm, lease)
    assert fast_calls(farm) == fast_before + 1


def test_mcp_endpoint_checks_the_token(farm, lease):
    url = lease["mcp_url"].rsplit("/", 1)[0]  # the header-authorized endpoint, no credential
    msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    assert httpx.post(url, json=msg, headers=accept).status_code == 401
    r = httpx.post(url, json=msg, headers={**accept, "Authorization": "Bearer wrong"})
    assert r.status_code == 403
    r = httpx.post(url, json=msg, headers={**accept, "Authorization": f"Bearer {lease['token']}"})
    assert r.status_code == 200 and r.json()["result"]["tools"]
