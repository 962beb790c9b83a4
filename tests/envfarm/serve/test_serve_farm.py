"""The farm on Ray Serve: owner routing over several replicas, batched path, MCP, the SDK, and a
replica killed mid-episode."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from envfarm.client import Farm, LeaseLost, reference_episode
from tests.envfarm.serve._traffic import (
    Tally,
    acquire,
    auth,
    check,
    lease_path,
    owner,
    write,
)
from tests.envfarm.serve.conftest import ENV, REPLICAS

pytestmark = pytest.mark.ray


async def test_owner_routing_keeps_leases_isolated(serve_farm):
    n = 54
    async with httpx.AsyncClient(base_url=serve_farm.url, timeout=60) as c:
        infos = [(await c.post(f"/envs/{ENV}/leases", json={})).json() for _ in range(n)]
        owners = {i["lease_id"].split("-")[0] for i in infos}
        assert len(owners) >= REPLICAS, f"leases landed on {owners}"

        async def episode(info: dict) -> set[str]:
            path = f"/envs/{ENV}/leases/{info['lease_id']}"
            r = await c.post(path + "/call", headers=auth(info), json={
                "tool": "create_wishlist", "arguments": {"name": info["lease_id"]}})
            assert r.status_code == 200 and r.json()["ok"], r.text
            r = await c.post(path + "/call", headers=auth(info), json={"tool": "list_wishlists"})
            return {w["name"] for w in r.json()["result"]["wishlists"]}

        seen = await asyncio.gather(*(episode(i) for i in infos))
        ids = {i["lease_id"] for i in infos}
        for info, names in zip(infos, seen):
            assert info["lease_id"] in names
            assert not (names & ids) - {info["lease_id"]}, "a lease saw another lease's state"
        for info in infos:
            r = await c.delete(f"/envs/{ENV}/leases/{info['lease_id']}", headers=auth(info))
            assert r.json()["status"] == "closed"


async def test_batched_path_and_metrics_through_the_front(serve_farm):
    async with Farm(serve_farm.url) as farm:
        leases = [await farm.acquire(ENV) for _ in range(9)]
        out = await farm.batch_call([(lease, "list_wishlists", {}) for lease in leases])
        assert all(r.ok for r in out)
        async with httpx.AsyncClient(base_url=serve_farm.url) as c:
            text = (await c.get("/metrics")).text
            assert text.count("# TYPE envfarm_leases_active gauge") == 1
            owners = {lease.lease_id.split("-")[0] for lease in leases}
            assert all(f'owner="{o}"' in text for o in owners)
            assert (await c.get("/envs")).json()
        for lease in leases:
            await lease.release()


async def test_sdk_and_mcp_episodes_through_serve(serve_farm, bundled_catalog):
    from fastmcp import Client
    from fastmcp.client.transports import StreamableHttpTransport

    async with Farm(serve_farm.url) as farm:
        report = await reference_episode(farm, ENV, 0, bundled_catalog[ENV].solutions[0])
        assert report.verdict.reward == 1.0
        async with farm.lease(ENV) as lease:
            transport = StreamableHttpTransport(lease.mcp_url,
                                                headers={"Authorization": f"Bearer {lease.token}"})
            async with Client(transport) as mcp:
                assert "create_wishlist" in {t.name for t in await mcp.list_tools()}
                res = await mcp.call_tool("create_wishlist", {"name": "mcp-on-serve"})
                assert not res.is_error
            names = {w["name"] for w in (await lease.call("list_wishlists"))["wishlists"]}
            assert "mcp-on-serve" in names


async def test_in_cluster_path_through_handles(serve_farm):
    from envfarm.serve import InClusterFarm

    farm = await InClusterFarm.connect()
    leases = [await farm.lease(ENV) for _ in range(6)]
    results = await farm.call_many([(lease, "create_wishlist", {"name": lease.lease_id})
                                    for lease in leases])
    assert all(r.result is not None and r.result.ok for r in results)
    listed = await farm.call(leases[0], "list_wishlists")
    names = {w["name"] for w in listed.result["wishlists"]}
    assert leases[0].lease_id in names and leases[1].lease_id not in names
    released = [(await farm.release(lease)).status.value for lease in leases]
    assert released == ["closed"] * len(leases)


def test_front_serves_the_whole_openapi(serve_farm):
    schema = httpx.get(serve_farm.url + "/openapi.json").json()
    assert "/envs/{env}/leases/{lease_id}/call" in schema["paths"]
    assert "/envs/{env}/owners/{owner}/batch" in schema["paths"]
    assert httpx.get(serve_farm.url + "/docs").status_code == 200


async def test_front_serves_the_status_page_over_every_replica(serve_farm):
    async with Farm(serve_farm.url) as farm, httpx.AsyncClient(base_url=serve_farm.url) as c:
        leases = [await farm.acquire(ENV) for _ in range(6)]
        for lease in leases:
            await lease.call("list_wishlists")
        assert (await c.get("/")).headers["location"] == "status"
        page = await c.get("/status")
        assert page.status_code == 200 and "status.json" in page.text
        status = (await c.get("/status.json")).json()
        for lease in leases:
            await lease.release()
    assert status["mode"] == "serve" and status["unreachable"] == 0
    replicas = {r["owner"]: r for r in status["replicas"]}
    assert len(replicas) == REPLICAS
    assert {lease.lease_id.split("-")[0] for lease in leases} <= set(replicas)
    assert all(r["app"] == f"env-{ENV}" and r["envs"] == [ENV] for r in replicas.values())
    (env,) = status["envs"]
    assert env["env"] == ENV and env["replicas"] == REPLICAS
    assert env["leased"] >= 6 and env["calls"] >= 6 and env["calls_per_s"] > 0
    assert env["p50_ms"] > 0 and env["errors"]["env_error"] == 0
    assert status["leases"] == sum(r["leases"] for r in replicas.values()) >= 6


async def test_openenv_episode_and_fork_through_serve(serve_farm, bundled_catalog):
    """openenv-core's client through Serve's ingress: the front holds the sockets, the leases
    live in pool replicas (owner-routed), a fork branches one there; closing releases both."""
    pytest.importorskip("openenv.core.mcp_client", reason="openenv-core is not installed")
    from openenv.core.env_server.mcp_types import CallToolAction

    from tests.envfarm.farm.openenv_client import AWMShaped

    steps = bundled_catalog[ENV].solutions[4]

    async def leases() -> int:  # over every replica now (healthz keeps its answer 1 s)
        return (await farm._json("GET", "/status.json", safe=True))["leases"]

    async with Farm(serve_farm.url) as farm:
        before = await leases()
        async with AWMShaped(base_url=serve_farm.url) as parent, \
                AWMShaped(base_url=serve_farm.url) as branch:
            await parent.reset(scenario=ENV, task_idx=4)
            assert len(await parent.list_tools()) > 10
            for step in steps[:2]:
                await parent.step(CallToolAction(tool_name=step.tool, arguments=step.arguments))
            forked = (await parent.step(CallToolAction(tool_name="fork"))).observation
            fork = forked.tool_result
            obs = (await branch.reset(scenario=ENV, task_idx=4, lease_id=fork["lease_id"],
                                      lease_token=fork["token"])).observation
            assert obs.reward_type == "reset_ok", obs.error
            for step in steps[2:]:
                await branch.step(CallToolAction(tool_name=step.tool, arguments=step.arguments))
            assert (await branch.step(CallToolAction(tool_name="verify"))).reward == 1.0
            assert (await parent.step(CallToolAction(tool_name="verify"))).reward < 1.0
            assert fork["lease_id"].split("-")[0] == fork["forked_from"].split("-")[0]
            assert await leases() == before + 2
        deadline = time.monotonic() + 10
        while await leases() > before:
            assert time.monotonic() < deadline, "closed sockets kept their leases"
            await asyncio.sleep(0.2)


async def test_killed_replica_gives_410_and_the_farm_goes_on(serve_farm):
    """SIGKILL a replica while calls flow on leases of every replica: its leases get a typed
    410 (in-flight calls included), never a fresh state; other leases never notice."""
    from ray import serve

    handle = serve.get_deployment_handle("pool", app_name=f"env-{ENV}")
    replicas = {}
    for i in range(REPLICAS):
        who = await handle.whoami.remote(owner=f"#{i}")
        replicas[who["owner"]] = who["pid"]
    tally, stop = Tally(), asyncio.Event()
    async with httpx.AsyncClient(base_url=serve_farm.url, timeout=30) as c:
        infos = [await acquire(c, tally) for _ in range(12)]
        assert all([await write(c, info, tally) for info in infos])
        by_owner: dict[str, list[dict]] = {}
        for info in infos:
            by_owner.setdefault(owner(info), []).append(info)
        assert len(by_owner) >= 2
        victim, survivor = list(by_owner)[:2]

        async def traffic(info: dict) -> list[int]:
            codes = []
            while not stop.is_set() and (not codes or codes[-1] == 200):
                codes.append(await check(c, info, tally))
            return codes

        flows = [asyncio.create_task(traffic(info)) for info in infos]
        await asyncio.sleep(0.5)
        os.kill(replicas[victim], signal.SIGKILL)  # a replica process Ray started for this test
        deadline = time.monotonic() + 60
        while not all(f.done() for f, i in zip(flows, infos) if owner(i) == victim):
            assert time.monotonic() < deadline, f"lost leases never got 410: {tally.summary()}"
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # the other leases go on after the victim's all got 410
        stop.set()
        codes = dict(zip((i["lease_id"] for i in infos), await asyncio.gather(*flows)))
        print(f"\nreplica killed mid-traffic: {tally.summary()}")

        assert not tally.ours_5xx and not tally.proxy_5xx, tally.summary()
        assert not tally.wrong_state and not tally.transport, tally.summary()
        lost = {i["lease_id"] for i in by_owner[victim]}
        assert set(tally.gone) == lost and set(tally.gone.values()) == {"gone"}
        assert all(codes[lid][-1] == 410 for lid in lost)
        assert all(set(codes[lid]) == {200} for lid in codes if lid not in lost)
        r = await c.post(lease_path(by_owner[victim][0]) + "/call",
                         headers=auth(by_owner[victim][0]), json={"tool": "list_wishlists"})
        assert r.status_code == 410 and "gone" in r.json()["error"]["message"]

        for info in by_owner[victim][1:]:  # every lease of the dead replica: 410
            r = await c.get(lease_path(info) + "/tools", headers=auth(info))
            assert r.status_code == 410

        alive = by_owner[survivor][0]
        assert await check(c, alive, tally) == 200
        r = await c.post(f"/envs/{ENV}/leases", json={})
        assert r.status_code == 201

    async with Farm(serve_farm.url) as farm:
        lease = await farm.acquire(ENV)
        await lease.tools()
        ghost = lease.info.model_copy(update={"lease_id": f"{victim}-00ff"})
        lease.info = ghost
        with pytest.raises(LeaseLost):
            await lease.tools()


def test_healthz_says_ready_with_every_env_warm(serve_farm):
    r = httpx.get(serve_farm.url + "/healthz")
    assert r.status_code == 200, r.text
    health = r.json()
    assert health["ready"] is True and health["waiting_for"] == [] and health["envs"] == [ENV]
    assert health["free_instances"] >= 1
    assert httpx.get(serve_farm.url + "/status.json").json()["ready"] is True


@pytest.mark.skipif(os.geteuid() != 0, reason="a farm that is not root keeps its uid in workers")
def test_env_workers_under_serve_run_as_uids_of_their_own(serve_farm):
    """The replicas spawn workers independently; each still gets an unprivileged uid no other
    worker has (issue 34)."""
    import psutil

    # Leases on several replicas, so several replicas have a worker (the replica an earlier test
    # killed may not take leases yet).
    with httpx.Client(base_url=serve_farm.url, timeout=60) as c:
        infos = [c.post(f"/envs/{ENV}/leases", json={}).json() for _ in range(6 * REPLICAS)]
        replicas = len({i["lease_id"].split("-")[0] for i in infos})
        assert replicas >= 2
        try:
            uids = [p.uids().real for p in psutil.Process().children(recursive=True)
                    if "envfarm.worker" in " ".join(p.cmdline())]
        finally:
            for info in infos:
                c.delete(f"/envs/{ENV}/leases/{info['lease_id']}", headers=auth(info))
    assert len(uids) >= replicas
    assert all(uid >= 0x7000_0000 for uid in uids) and len(set(uids)) == len(uids), uids
