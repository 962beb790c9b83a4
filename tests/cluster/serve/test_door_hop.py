"""The Door's direct hop (cluster.serve._direct): a lease's requests go over HTTP to the listener
of the replica that owns it, with the same answers the handle hop gives, and a killed owner
costs only its own leases."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from cluster.serve._handles import fresh_call
from envfarm.client import Farm
from envfarm.errors import LeaseGone
from envfarm.wire import owner_of
from tests.cluster.serve._traffic import Tally, acquire, auth, check, lease_path, owner, write
from tests.cluster.serve.conftest import ENV, REPLICAS

pytestmark = pytest.mark.ray

APP = f"env-{ENV}"


def _handles():
    from ray import serve

    return (serve.get_deployment_handle("door", app_name=APP),
            serve.get_deployment_handle("pool", app_name=APP))


async def _replicas(pool) -> dict[str, dict]:
    return {w["owner"]: w for w in [await fresh_call(pool.whoami, owner=f"#{i}")
                                    for i in range(REPLICAS)]}


async def test_a_leases_calls_reach_its_owner_over_the_direct_hop(serve_farm):
    door, pool = _handles()
    assert (await door.hop.remote())["hop"] == "http"  # the default
    before = await _replicas(pool)
    sent0 = (await door.hop.remote())["sent_direct"]
    tally = Tally()
    async with httpx.AsyncClient(base_url=serve_farm.url, timeout=60) as c:
        infos = [await acquire(c, tally) for _ in range(12)]
        assert all([await write(c, info, tally) for info in infos])
        assert all([await check(c, info, tally) == 200 for info in infos])
        after = await _replicas(pool)
        sent = (await door.hop.remote())["sent_direct"] - sent0
        for info in infos:
            await c.delete(lease_path(info), headers=auth(info))
    assert not tally.wrong_state and not tally.ours_5xx, tally.summary()
    assert sent == 2 * len(infos)  # every write and read took the direct hop
    # an embedded farm's listeners are on loopback, as everything else of it
    listeners = (await door.hop.remote())["listeners"]
    assert listeners and all(u.startswith("http://127.0.0.1:") for u in listeners), listeners
    # ... to the owner itself: no replica handed a request on, each holds its own leases
    assert all(after[o]["handed_on"] == before[o]["handed_on"] for o in after)
    for o in {owner(i) for i in infos}:
        assert after[o]["leases"] - before[o]["leases"] == sum(owner(i) == o for i in infos)


async def test_a_direct_client_sends_a_leases_requests_to_its_owner_past_the_door(serve_farm):
    """New leases (one, a batch, a fork) name their owner's listener; ``Farm(direct=True)``
    sends each lease's requests there: not one reaches the Door, each lands on its owner."""
    door, pool = _handles()
    before = await _replicas(pool)
    async with Farm(serve_farm.url, direct=True) as farm:
        asked0 = (await door.hop.remote())["requests"]
        leases = [await farm.acquire(ENV) for _ in range(6)] + await farm.acquire_many(ENV, 2)
        # new leases take turns among the Door and the listeners named so far
        asked = (await door.hop.remote())["requests"] - asked0
        assert 2 <= asked <= 5, asked
        sent0 = (await door.hop.remote())["sent_direct"]
        for lease in leases:
            await lease.call("create_wishlist", {"name": f"direct-{lease.lease_id}"})
        leases.append(await leases[0].fork())  # asked of the owner itself
        await leases[-1].call("create_wishlist", {"name": f"direct-{leases[-1].lease_id}"})
        urls = {lease.info.direct_url for lease in leases}
        assert None not in urls and all(u.startswith("http://127.0.0.1:") for u in urls), [
            i for i, lease in enumerate(leases) if lease.info.direct_url is None]
        assert urls <= set((await door.hop.remote())["listeners"])
        for lease in leases:
            names = [w["name"] for w in (await lease.call("list_wishlists"))["wishlists"]
                     if w["name"].startswith("direct-")]
            expected = {f"direct-{lease.lease_id}"}
            if lease is leases[-1]:  # the fork began with its parent's state
                expected.add(f"direct-{leases[0].lease_id}")
            assert set(names) == expected, names
        # many leases' calls in one request per owner go to the owners' listeners too
        batch = await farm.batch_call([(lease, "list_wishlists", {}) for lease in leases])
        assert all(not isinstance(r, Exception) and r.ok for r in batch), batch
        through_door = (await door.hop.remote())["sent_direct"] - sent0
        after = await _replicas(pool)
        for lease in leases:
            await lease.release()
    assert through_door == 0
    assert all(after[o]["handed_on"] == before[o]["handed_on"] for o in after)


async def test_a_direct_client_gets_the_farms_answers_for_bad_requests(serve_farm):
    """A lease's token on another lease, at its owner's listener: the same 403 as through the
    Door (the listener is the replica's app, tokens and tenants checked as ever)."""
    async with Farm(serve_farm.url, direct=True) as farm:
        mine, other = await farm.acquire(ENV), await farm.acquire(ENV)
        async with httpx.AsyncClient(timeout=60) as c:
            url = other.info.direct_url + other.path + "/call"
            forged = await c.post(url, headers={"Authorization": f"Bearer {mine.token}"},
                                  json={"tool": "list_wishlists"})
            anonymous = await c.post(url, json={"tool": "list_wishlists"})
        await mine.release()
        await other.release()
    assert (forged.status_code, anonymous.status_code) == (403, 401)


async def test_forged_and_foreign_leases_are_refused_as_by_handle(serve_farm):
    """A forged lease id, another owner's, another lease's token, no token: each answer over
    the direct hop is the handle hop's, status and body."""
    door, _ = _handles()
    async with httpx.AsyncClient(base_url=serve_farm.url, timeout=60) as c:
        mine = (await c.post(f"/envs/{ENV}/leases", json={})).json()
        other = (await c.post(f"/envs/{ENV}/leases", json={})).json()
        base, call = f"/envs/{ENV}/leases", {"tool": "list_wishlists"}
        cases = [(f"{base}/{owner(mine)}-00ff/call", auth(mine)),  # the owner's, no such lease
                 (f"{base}/nosuchreplica-{'0' * 16}/call", auth(mine)),  # no such owner
                 (f"{lease_path(other)}/call", auth(mine)),  # another lease's token
                 (f"{lease_path(other)}/call", {}),  # none
                 (f"{lease_path(other)}/call", {"Authorization": "Bearer forged"})]

        async def answers() -> list[tuple[int, bytes]]:
            out = []
            for path, headers in cases:
                r = await c.post(path, headers=headers, json=call)
                out.append((r.status_code, r.content))
            return out

        try:
            direct = await answers()
            await door.hop.remote("handle")
            by_handle = await answers()
        finally:
            await door.hop.remote("http")
        for path, headers in [(lease_path(mine), auth(mine)), (lease_path(other), auth(other))]:
            await c.delete(path, headers=headers)
    assert direct == by_handle
    assert [status for status, _ in direct] == [404, 410, 403, 401, 403]


async def test_a_killed_owner_loses_only_its_own_leases_over_the_direct_hop(serve_farm):
    """Through the Door and from a direct client alike: the killed owner's leases get a typed
    410 (the direct client falls back to the Door, which knows), every other lease goes on."""
    door, pool = _handles()
    replicas = await _replicas(pool)
    tally = Tally()
    async with httpx.AsyncClient(base_url=serve_farm.url, timeout=60) as c, \
            Farm(serve_farm.url, direct=True) as farm:
        infos = [await acquire(c, tally) for _ in range(12)]
        assert all([await write(c, info, tally) for info in infos])
        direct = [await farm.acquire(ENV) for _ in range(8)]
        while len({owner_of(lease.lease_id) for lease in direct}) < 2 and len(direct) < 40:
            direct.append(await farm.acquire(ENV))  # the client learns both listeners
        owners = {owner(i) for i in infos}
        assert len(owners) >= 2, owners
        victim = sorted(owners)[0]
        os.kill(replicas[victim]["pid"], signal.SIGKILL)  # a replica Ray started for this test
        await asyncio.sleep(0.5)
        codes = {i["lease_id"]: await check(c, i, tally) for i in infos}
        asked0 = (await door.hop.remote())["requests"]
        outcomes = {}
        for lease in direct:
            try:
                await lease.call("list_wishlists")
                outcomes[lease.lease_id] = "ok"
            except LeaseGone:
                outcomes[lease.lease_id] = "gone"
        # the dead owner's leases asked the surviving listener (it handed them on), not the Door
        asked = (await door.hop.remote())["requests"] - asked0
        for info in infos:
            if owner(info) != victim:
                await c.delete(lease_path(info), headers=auth(info))
        for lease in direct:
            if owner_of(lease.lease_id) != victim:
                await lease.release()
    assert outcomes == {lease.lease_id: "gone" if owner_of(lease.lease_id) == victim else "ok"
                        for lease in direct}, outcomes
    assert "gone" in outcomes.values() and asked == 0, asked
    lost = {i["lease_id"] for i in infos if owner(i) == victim}
    assert {lid for lid, code in codes.items() if code == 410} == lost
    assert all(code == 200 for lid, code in codes.items() if lid not in lost)
    assert set(tally.gone) == lost and set(tally.gone.values()) == {"gone"}
    assert not tally.wrong_state and not tally.ours_5xx and not tally.proxy_5xx, tally.summary()
