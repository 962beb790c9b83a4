"""Forking a live lease: the child starts from the parent's state at that moment (steps and
env errors kept for verification), counts against the tenant's quota, and the parent goes on
untouched; forks of forks; in-process and across confined workers."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from cluster.compose import compose_core
from envfarm.client import ASGITransport, Farm, LeaseLost
from envfarm.errors import EnvLoadError, QuotaExceeded
from envfarm.farm import (
    FarmConfig,
    FarmCore,
    PoolConfig,
    Tenant,
    TenantsConfig,
    build_app,
    hash_key,
)
from tests.envfarm.farm.conftest import ENV, lifespan_running, new_lease

TASK = 4  # search, create_wishlist, add_hotel_to_wishlist x2 (the reference solution)


def wishlist_rows(db: bytes) -> list[tuple]:
    conn = sqlite3.connect(":memory:")
    conn.deserialize(db)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    table = next(t for t in tables if "wishlist" in t and ("item" in t or "hotel" in t))
    return sorted(conn.execute(f"SELECT * FROM {table}").fetchall())


async def call(client, path, headers, tool, arguments):
    r = await client.post(path + "/call", headers=headers,
                          json={"tool": tool, "arguments": arguments})
    assert r.status_code == 200 and r.json()["ok"], r.text
    return r.json()["result"]


async def verify(client, path, headers) -> dict:
    r = await client.post(path + "/verify", headers=headers, json={})
    assert r.status_code == 200, r.text
    return r.json()


async def snapshot(client, path, headers) -> bytes:
    r = await client.get(path + "/snapshot", headers=headers)
    assert r.status_code == 200
    return r.content


async def fork(client, path, headers, **body) -> tuple[str, dict[str, str], dict]:
    r = await client.post(path + "/fork", headers=headers, json=body)
    assert r.status_code == 201, r.text
    info = r.json()
    return (f"/envs/{ENV}/leases/{info['lease_id']}",
            {"Authorization": f"Bearer {info['token']}"}, info)


async def test_fork_branches_an_episode_and_leaves_the_parent_alone(client, bundled_catalog):
    steps = bundled_catalog[ENV].solutions[TASK]
    path, headers, info = await new_lease(client, task_idx=TASK)
    for step in steps[:2]:  # search, create the wishlist
        await call(client, path, headers, step.tool, step.arguments)
    before = await snapshot(client, path, headers)

    child_path, child_headers, child = await fork(client, path, headers)
    assert child["forked_from"] == info["lease_id"] and child["task_idx"] == TASK
    assert child["lease_id"] != info["lease_id"] and child["token"] != info["token"]
    assert await snapshot(client, child_path, child_headers) == before

    await call(client, child_path, child_headers, steps[2].tool, steps[2].arguments)
    # a fork of the fork, taken after one more step
    grand_path, grand_headers, grand = await fork(client, child_path, child_headers)
    assert grand["forked_from"] == child["lease_id"]
    await call(client, child_path, child_headers, steps[3].tool, steps[3].arguments)
    assert (await verify(client, child_path, child_headers))["reward"] == 1.0

    assert await snapshot(client, path, headers) == before  # the parent never saw the branch
    assert (await verify(client, path, headers))["reward"] != 1.0
    assert len(wishlist_rows(await snapshot(client, grand_path, grand_headers))) == \
        len(wishlist_rows(before)) + 1
    await call(client, grand_path, grand_headers, steps[3].tool, steps[3].arguments)
    assert (await verify(client, grand_path, grand_headers))["reward"] == 1.0

    # the parent's own episode goes on from where it was
    for step in steps[2:]:
        await call(client, path, headers, step.tool, step.arguments)
    assert (await verify(client, path, headers))["reward"] == 1.0


async def test_a_fork_keeps_the_steps_and_env_errors_so_far(core, client):
    path, headers, info = await new_lease(client, task_idx=TASK)
    await call(client, path, headers, "list_wishlists", {})
    parent = core.leases[info["lease_id"]]
    parent.env_errors.append("search_hotels: boom")  # an env failure earlier in the episode
    _, _, child = await fork(client, path, headers)
    record = core.leases[child["lease_id"]]
    assert list(record.steps) == [{"tool": "list_wishlists", "ok": True, "outcome": "ok"}]
    assert record.env_errors == ["search_hotels: boom"]
    verdict = await verify(client, f"/envs/{ENV}/leases/{child['lease_id']}",
                           {"Authorization": f"Bearer {child['token']}"})
    assert verdict["outcome"] == "environment_error" and verdict["reward"] is None
    # the parent's record is its own list: the child's later steps do not reach it
    record.steps.append("x", "ok")
    assert len(parent.steps) == 1


async def test_fork_is_idempotent_and_needs_the_parents_token(client):
    path, headers, _ = await new_lease(client, task_idx=TASK)
    _, _, first = await fork(client, path, headers, idempotency_key="k1")
    _, _, again = await fork(client, path, headers, idempotency_key="k1")
    assert again["lease_id"] == first["lease_id"]
    r = await client.post(path + "/fork", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 403
    r = await client.post(path + "/fork")
    assert r.status_code == 401
    await client.delete(path, headers=headers)
    r = await client.post(path + "/fork", headers=headers)
    assert r.status_code == 410


async def test_a_fork_counts_against_the_parents_tenant(make_core):
    key = "efk_test_key_fork"
    tenants = TenantsConfig(require_key=True, tenants=[
        Tenant(name="acme", key_sha256=hash_key(key), max_leases=2)])
    core = make_core(tenants=tenants)
    app = build_app(core)
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app),
                                            api_key=key) as farm:
        lease = await farm.acquire(ENV, task_idx=TASK)
        child = await lease.fork()
        assert core.leases[child.lease_id].tenant == "acme"
        assert core.tenants.usage["acme"].leases == 2
        with pytest.raises(QuotaExceeded):
            await lease.fork()
        assert core.tenants.usage["acme"].leases == 2  # the refused fork reserved nothing
        await child.release()
        grandchild = await lease.fork()
        assert (await grandchild.snapshot()) == (await lease.snapshot())
        await grandchild.release()
        await lease.release()
        with pytest.raises(LeaseLost):
            await lease.fork()


@asynccontextmanager
async def worker_farm(catalog, **config) -> AsyncIterator[tuple[FarmCore, Farm]]:
    """A farm whose env code runs in confined workers, in-process over ASGI."""
    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1),
                                   check_module_state=False, **config), catalog=catalog)
    app = build_app(core)
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app)) as farm:
        yield core, farm


async def test_fork_across_confined_workers(bundled_catalog):
    """Each lease gets a worker of its own (leases_per_worker=1): the fork's database travels
    from one jailed worker through the front into another."""
    steps = bundled_catalog[ENV].solutions[TASK]
    async with worker_farm(bundled_catalog, leases_per_worker=1) as (core, farm):
        lease = await farm.acquire(ENV, task_idx=TASK)
        for step in steps[:2]:
            await lease.call(step.tool, step.arguments)
        child = await lease.fork()
        parent_inst, child_inst = (core.leases[x].instance for x in (lease.lease_id,
                                                                      child.lease_id))
        assert parent_inst.worker is not child_inst.worker
        assert await child.snapshot() == await lease.snapshot()
        for step in steps[2:]:
            await child.call(step.tool, step.arguments)
        assert (await child.verify()).reward == 1.0
        assert (await lease.verify()).reward != 1.0
        # bytes a worker cannot read are refused with a typed error; the worker lives on
        spare = await farm.acquire(ENV)
        spare_inst = core.leases[spare.lease_id].instance
        with pytest.raises(EnvLoadError):
            await spare_inst.restore(b"SQLite format 3\x00" + b"\xff" * 600)
        with pytest.raises(EnvLoadError):
            await spare_inst.restore(b"not a database")
        assert spare_inst.worker.lost is None
        assert await spare.call("list_wishlists", {}) is not None


async def test_fork_within_one_worker_copies_inside_it(bundled_catalog):
    """Parent and child on the same worker: the state is cloned there (no bytes through the
    front), at the moment of the fork; the parent goes on untouched."""
    steps = bundled_catalog[ENV].solutions[TASK]
    async with worker_farm(bundled_catalog) as (core, farm):
        lease = await farm.acquire(ENV, task_idx=TASK)
        for step in steps[:3]:
            await lease.call(step.tool, step.arguments)
        before = await lease.snapshot()
        child = await lease.fork()
        assert core.leases[child.lease_id].instance.worker is \
            core.leases[lease.lease_id].instance.worker
        assert await child.snapshot() == before
        await child.call(steps[3].tool, steps[3].arguments)
        assert (await child.verify()).reward == 1.0
        assert await lease.snapshot() == before


def test_an_unreadable_image_fails_the_call_not_the_host(hotel_runtime):
    """A restored image with a whole header but garbage pages: the first call is an env_error
    (the episode invalid), the instance resets to a working state."""
    inst = hotel_runtime.instance()
    good = inst.snapshot()
    with pytest.raises(sqlite3.DatabaseError):
        inst.restore(b"garbage" * 100)
    inst.restore(good[:100] + b"\x07" * (len(good) - 100))
    res = inst.call_sync("list_wishlists", {})
    assert not res.ok and res.error.kind == "env_error"
    inst.reset()
    assert inst.call_sync("list_wishlists", {}).ok
    inst.close()
