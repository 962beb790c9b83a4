"""Release races: a request whose body is still on its way when its lease is released (and the
instance handed to a new lease) must not land in the new lease's database, on any route."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from envfarm.farm import PoolConfig
from tests.envfarm.farm.conftest import ENV, farm_client

MCP = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def create(name: str) -> dict:
    return {"tool": "create_wishlist", "arguments": {"name": name}}


def mcp_create(name: str) -> dict:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "create_wishlist", "arguments": {"name": name}}}


ROUTES = {
    # route -> (path of the lease's info, headers, body)
    "call (fast path)": (lambda i: f"/envs/{ENV}/leases/{i['lease_id']}/call", True, create),
    "mcp capability URL": (lambda i: i["mcp_url"], False, mcp_create),
    "mcp bearer": (lambda i: f"/envs/{ENV}/leases/{i['lease_id']}/mcp", True, mcp_create),
}


async def wishlists(c, info: dict) -> set[str]:
    r = await c.post(f"/envs/{ENV}/leases/{info['lease_id']}/call", json={"tool": "list_wishlists"},
                     headers={"Authorization": f"Bearer {info['token']}"})
    return {w["name"] for w in r.json()["result"]["wishlists"]}


@pytest.mark.parametrize("fast_paths", [True, False], ids=["fast", "frameworks"])
@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_body_that_arrives_after_release_does_not_reach_the_next_lease(
        make_core, route, fast_paths):
    # one instance only: the next lease gets the very instance the first one gave back
    core = make_core(pool=PoolConfig(warm=0, max_instances=1), fast_paths=fast_paths)
    where, bearer, body = ROUTES[route]
    async with farm_client(core) as c:
        first = (await c.post(f"/envs/{ENV}/leases", json={})).json()
        instance = core.leases[first["lease_id"]].instance
        payload = json.dumps(body("from-the-released-lease")).encode()
        rest = asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            yield payload[:10]
            await rest.wait()
            yield payload[10:]

        headers = {**MCP, **({"Authorization": f"Bearer {first['token']}"} if bearer else {}),
                   "Content-Length": str(len(payload))}  # declared: streamed through as is
        pending = asyncio.create_task(c.post(where(first), content=slow_body(), headers=headers))
        await asyncio.sleep(0.05)  # the request is in, its body half sent
        r = await c.delete(f"/envs/{ENV}/leases/{first['lease_id']}",
                           headers={"Authorization": f"Bearer {first['token']}"})
        assert r.json()["status"] == "closed"
        await asyncio.sleep(0.05)  # the instance is reset and free again
        second = (await c.post(f"/envs/{ENV}/leases", json={})).json()
        assert core.leases[second["lease_id"]].instance.inst is instance.inst  # the same one
        rest.set()
        answer = await pending
        assert answer.status_code == 410, answer.text
        assert answer.json()["error"]["kind"] == "gone"
        assert "from-the-released-lease" not in await wishlists(c, second)


async def test_release_waits_for_an_in_flight_call(make_core):
    """A call holding the instance finishes on the old state; the instance is reset after it,
    and no lease gets it before that."""
    core = make_core(pool=PoolConfig(warm=0, max_instances=1))
    async with farm_client(core) as c:
        first = (await c.post(f"/envs/{ENV}/leases", json={})).json()
        instance = core.leases[first["lease_id"]].instance
        auth = {"Authorization": f"Bearer {first['token']}"}
        await instance.lock.acquire()  # a call of the first lease is running
        try:
            call = asyncio.create_task(c.post(f"/envs/{ENV}/leases/{first['lease_id']}/call",
                                              json=create("in-flight"), headers=auth))
            await asyncio.sleep(0.05)
            await c.delete(f"/envs/{ENV}/leases/{first['lease_id']}", headers=auth)
            busy = await c.post(f"/envs/{ENV}/leases", json={})
            assert busy.status_code == 503  # the only instance is still in use
        finally:
            instance.lock.release()
        assert (await call).json()["ok"] is True  # it ran, on the released lease's state
        await asyncio.sleep(0.05)
        second = (await c.post(f"/envs/{ENV}/leases", json={})).json()
        assert "in-flight" not in await wishlists(c, second)
