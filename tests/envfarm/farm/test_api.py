"""The lease API in-process: episodes, lifecycle, isolation, metrics."""

from __future__ import annotations

import asyncio
import sqlite3

from tests.envfarm.farm.conftest import ENV, new_lease


async def test_episode_with_reference_solution_scores_one(client, bundled_catalog):
    path, auth, info = await new_lease(client, task_idx=0)
    assert info["task"] == bundled_catalog[ENV].tasks[0]
    assert info["mcp_url"].startswith("http://farm" + path + "/mcp/")  # absolute, credential
    tools = (await client.get(path + "/tools", headers=auth)).json()
    assert "create_reservation" in {t["name"] for t in tools}
    for step in bundled_catalog[ENV].solutions[0]:
        r = await client.post(path + "/call", headers=auth,
                              json={"tool": step.tool, "arguments": step.arguments})
        assert r.status_code == 200 and r.json()["ok"], r.text
    verdict = (await client.post(path + "/verify", headers=auth)).json()
    assert verdict["outcome"] == "completed" and verdict["reward"] == 1.0 and verdict["valid"]
    assert (await client.delete(path, headers=auth)).json()["status"] == "closed"


async def test_untouched_state_verifies_incomplete(client):
    path, auth, _ = await new_lease(client, task_idx=0)
    verdict = (await client.post(path + "/verify", headers=auth, json={})).json()
    assert verdict == {**verdict, "outcome": "agent_error", "reward": 0.0, "valid": True}


async def test_verify_needs_a_task(client):
    path, auth, _ = await new_lease(client)
    r = await client.post(path + "/verify", headers=auth, json={})
    assert r.status_code == 404 and r.json()["error"]["kind"] == "not_found"
    r = await client.post(path + "/verify", headers=auth, json={"task_idx": 99})
    assert r.status_code == 404


async def test_release_is_idempotent_and_final(client):
    path, auth, _ = await new_lease(client)
    assert (await client.delete(path, headers=auth)).json()["status"] == "closed"
    assert (await client.delete(path, headers=auth)).json()["status"] == "already_closed"
    r = await client.post(path + "/call", headers=auth, json={"tool": "list_wishlists"})
    assert r.status_code == 410 and "released" in r.json()["error"]["message"]


async def test_leases_are_isolated_and_reset_restores(client):
    (p1, a1, _), (p2, a2, _) = await new_lease(client), await new_lease(client)
    r = await client.post(p1 + "/call", headers=a1,
                          json={"tool": "create_wishlist", "arguments": {"name": "only-in-1"}})
    assert r.json()["ok"], r.text

    async def names(path, auth):
        r = await client.post(path + "/call", headers=auth, json={"tool": "list_wishlists"})
        return {w["name"] for w in r.json()["result"]["wishlists"]}

    assert "only-in-1" in await names(p1, a1)
    assert "only-in-1" not in await names(p2, a2)
    assert (await client.post(p1 + "/reset", headers=a1)).json()["reset"] is True
    assert "only-in-1" not in await names(p1, a1)


async def test_released_instance_comes_back_reset(client, core):
    path, auth, _ = await new_lease(client)
    await client.post(path + "/call", headers=auth,
                      json={"tool": "create_wishlist", "arguments": {"name": "dirty"}})
    await client.delete(path, headers=auth)
    await asyncio.sleep(0.05)  # the background reset
    stats = core.envs[ENV].pool.stats()
    assert stats.leased == 0 and stats.resetting == 0 and stats.free >= 2
    for inst in core.envs[ENV].pool._free:
        assert inst.snapshot() == inst.initial_snapshot()


async def test_idempotency_key_returns_the_same_lease(client):
    body = {"idempotency_key": "k-1"}
    a = (await client.post(f"/envs/{ENV}/leases", json=body)).json()
    b = (await client.post(f"/envs/{ENV}/leases", json=body)).json()
    assert a["lease_id"] == b["lease_id"]
    c = (await client.post(f"/envs/{ENV}/leases", json={"idempotency_key": "k-2"})).json()
    assert c["lease_id"] != a["lease_id"]


async def test_concurrent_calls_on_one_lease_are_serialized(client):
    path, auth, _ = await new_lease(client)
    calls = [client.post(path + "/call", headers=auth, json={
        "tool": "create_wishlist", "arguments": {"name": f"w{i}"}}) for i in range(15)]
    results = await asyncio.gather(*calls)
    assert all(r.json()["ok"] for r in results)
    listed = (await client.post(path + "/call", headers=auth,
                                json={"tool": "list_wishlists"})).json()["result"]["wishlists"]
    assert {f"w{i}" for i in range(15)} <= {w["name"] for w in listed}


async def test_snapshot_downloads_sqlite(client, tmp_path):
    path, auth, _ = await new_lease(client)
    await client.post(path + "/call", headers=auth,
                      json={"tool": "create_wishlist", "arguments": {"name": "snap"}})
    r = await client.get(path + "/snapshot", headers=auth)
    assert r.status_code == 200 and r.content.startswith(b"SQLite format 3")
    db = tmp_path / "s.db"
    db.write_bytes(r.content)
    with sqlite3.connect(db) as conn:
        tables = [row[0] for row in conn.execute("select name from sqlite_master")]
    assert tables
    initial = await client.get(path + "/snapshot?which=initial", headers=auth)
    assert initial.content != r.content


async def test_batch_call_mixes_results_and_errors(client):
    (_, _, i1), (_, _, i2) = await new_lease(client), await new_lease(client)
    body = {"calls": [
        {"env": ENV, "lease_id": i1["lease_id"], "token": i1["token"], "tool": "list_wishlists"},
        {"env": ENV, "lease_id": i2["lease_id"], "token": "wrong", "tool": "list_wishlists"},
        {"env": ENV, "lease_id": i2["lease_id"], "token": i2["token"], "tool": "nope"},
    ]}
    results = (await client.post("/batch/call", json=body)).json()["results"]
    assert results[0]["result"]["ok"] is True
    assert results[1]["error"]["status"] == 403
    assert results[2]["result"]["error"]["kind"] == "agent_error"


async def test_catalog_health_metrics(client):
    envs = (await client.get("/envs")).json()
    assert {e["name"]: e["served"] for e in envs}[ENV] is True
    detail = (await client.get(f"/envs/{ENV}")).json()
    assert detail["tools"] and detail["pool"]["free"] >= 2
    path, auth, _ = await new_lease(client)
    await client.post(path + "/call", headers=auth, json={"tool": "list_wishlists"})
    health = (await client.get("/healthz")).json()
    assert health["leases_active"] == 1 and health["envs"] == [ENV]
    text = (await client.get("/metrics")).text
    assert 'envfarm_leases_active{owner=' in text
    assert f'envfarm_calls_total{{env="{ENV}",outcome="ok"}} 1.0' in text
    assert "envfarm_call_latency_seconds_bucket" in text
    assert (await client.get("/openapi.json")).json()["paths"]


async def test_owner_batch_and_lease_batch(client, core):
    r = await client.post(f"/envs/{ENV}/leases:batch", json={"count": 3, "task_idx": 1})
    assert r.status_code == 201
    infos = r.json()
    assert len({i["lease_id"] for i in infos}) == 3 and all(i["task_idx"] == 1 for i in infos)
    calls = [{"env": ENV, "lease_id": i["lease_id"], "token": i["token"],
              "tool": "list_wishlists"} for i in infos]
    calls.append({"env": ENV, "lease_id": "otherowner-00aa", "token": "t",
                  "tool": "list_wishlists"})
    r = await client.post(f"/envs/{ENV}/owners/{core.owner}/batch", json={"calls": calls})
    results = r.json()["results"]
    assert [x["result"]["ok"] for x in results[:3]] == [True] * 3
    assert results[3]["error"]["status"] == 410
    r = await client.post(f"/envs/{ENV}/leases:batch", json={"count": 0})
    assert r.status_code == 422
