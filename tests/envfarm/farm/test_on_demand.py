"""A hundred env types on one farm, loaded on demand into jailed workers (issue 26 at small
scale; the 1,000-type figures come from benchmarks/farm/bench_on_demand.py)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx
import pytest

from tests.fakes.catalog_1k import make_catalog
from envfarm.catalog import load_catalog
from envfarm.client import ASGITransport, Farm
from envfarm.errors import EnvBroken, TooManyTypesLoaded
from envfarm.farm import (
    FarmConfig,
    FarmCore,
    PoolConfig,
    Tenant,
    TenantsConfig,
    build_app,
    hash_key,
)
from envfarm.wire import EnvState, LeaseRequest
from envfarm.worker import WorkerEnv
from tests.envfarm.farm.conftest import lifespan_running

TYPES = 100


@pytest.fixture(scope="module")
def catalog_100(tmp_path_factory):
    path = tmp_path_factory.mktemp("catalog_100")
    names = make_catalog(path, types=TYPES, broken=1)
    return load_catalog(path, check_code=False), names


def _core(catalog, **config) -> FarmCore:
    config.setdefault("pool", PoolConfig(warm=1))
    return FarmCore(FarmConfig(**config), catalog=catalog)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_on_demand_is_the_default_above_sixteen_types():
    assert FarmConfig().loads_on_demand(16) is False
    assert FarmConfig().loads_on_demand(17) is True
    assert FarmConfig(on_demand=False).loads_on_demand(1000) is False
    assert FarmConfig(on_demand=True).loads_on_demand(3) is True


async def test_types_load_at_first_lease_share_one_cold_start_and_evict(catalog_100):
    catalog, names = catalog_100
    started = time.perf_counter()
    core = _core(catalog, evict_idle_s=30)
    assert time.perf_counter() - started < 10  # nothing compiled, no env worker started
    counts = core.registry.counts()
    assert (counts.types, counts.loaded, counts.cold) == (TYPES, 0, TYPES)
    assert core.env_names() == sorted(names)
    await core.start()
    try:
        env = names[0]
        leases = await asyncio.gather(*(core.create_lease(env, LeaseRequest())
                                        for _ in range(3)))
        assert core.registry.counts().cold_starts == 1  # three leases, one load
        served = core.envs[env]
        assert isinstance(served, WorkerEnv) and served.probed
        pids = [w.pid for w in served.workers]
        assert len(pids) == 1 and all(_alive(p) for p in pids)
        lease = core.lease(env, leases[0].lease_id, leases[0].token)
        tool = core.tools(lease)[0].name
        res = await core.call(lease, tool, {})
        assert res.ok or res.error.kind == "agent_error"  # served by the worker, typed

        # A leased type is never evicted, however long it sits idle.
        later = time.monotonic() + 3600
        assert await core.registry.evict_idle(now=later) == []
        for info in leases:
            core.release(env, info.lease_id, info.token)
        assert await core.registry.evict_idle(now=time.monotonic() + 1) == []  # not idle yet
        assert await core.registry.evict_idle(now=later) == [env]
        assert env not in core.envs and core.registry.state(env) is EnvState.cold
        assert not any(_alive(p) for p in pids)  # its worker stopped: memory returned
        assert core.registry.counts().evictions == 1

        # Loaded again: a new cold start, with the module-state verdict known (no probe).
        again = await core.create_lease(env, LeaseRequest())
        assert core.registry.counts().cold_starts == 2
        assert core.envs[env].probed is False
        core.release(env, again.lease_id, again.token)
    finally:
        await core.aclose()


async def test_a_broken_type_is_typed_marked_and_skipped(catalog_100):
    catalog, names = catalog_100
    broken, fine = names[-1], names[1]
    core = _core(catalog)
    await core.start()
    try:
        for _ in range(2):  # the second answer comes from the mark, not from another load
            with pytest.raises(EnvBroken, match="broken on purpose") as err:
                await core.create_lease(broken, LeaseRequest())
            assert 59 < err.value.retry_after_s <= 60  # the first backoff: broken_retry_s
        assert core.registry.state(broken) is EnvState.broken
        counts = core.registry.counts()
        assert (counts.broken, counts.cold_starts, counts.broken_retries) == (1, 0, 0)
        assert any(p.startswith(broken) for p in core.problems)
        info = await core.create_lease(fine, LeaseRequest())  # the others keep serving
        assert info.env == fine
    finally:
        await core.aclose()


async def test_hot_types_load_at_start_and_stay(catalog_100):
    catalog, names = catalog_100
    hot = names[2]
    core = _core(catalog, hot=[hot], evict_idle_s=1)
    try:
        assert list(core.envs) == [hot]
        assert await core.registry.evict_idle(now=time.monotonic() + 3600) == []
    finally:
        await core.aclose()


async def test_http_warm_up_status_metrics_and_broken_answer(catalog_100):
    catalog, names = catalog_100
    core = _core(catalog)
    env, broken = names[3], names[-1]
    app = build_app(core)
    async with lifespan_running(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://farm") as client, \
            Farm("http://farm", transport=ASGITransport(app)) as sdk:
        listed = {e["name"]: e["state"] for e in (await client.get("/envs")).json()}
        assert listed[env] == "cold" and len(listed) == TYPES

        r = await client.post(f"/envs/{env}/warm")
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "loaded" and r.json()["tools"]
        assert [d.state for d in await sdk.warm(env)] == [EnvState.loaded]  # loaded already

        # MCP for a type loaded after the farm started: its MCP app starts at first use.
        r = await client.post(f"/envs/{names[4]}/leases", json={})
        assert r.status_code == 201, r.text
        info = r.json()
        mcp = f"/envs/{names[4]}/leases/{info['lease_id']}/mcp"
        headers = {"Accept": "application/json, text/event-stream",
                   "Authorization": f"Bearer {info['token']}"}
        listing = await asyncio.gather(*(client.post(
            mcp, json={"jsonrpc": "2.0", "id": i, "method": "tools/list", "params": {}},
            headers=headers) for i in range(3)))  # concurrent first requests share one start
        assert all(r.status_code == 200 and r.json()["result"]["tools"] for r in listing)
        tool = listing[0].json()["result"]["tools"][0]["name"]
        r = await client.post(mcp, headers=headers, json={
            "jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": tool, "arguments": {}}})
        assert r.status_code == 200 and "result" in r.json(), r.text

        r = await client.post(f"/envs/{broken}/leases", json={})
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "EnvBroken"
        with pytest.raises(EnvBroken):
            await sdk.warm(broken)

        types = (await client.get("/status.json")).json()["types"]
        assert types == {"types": TYPES, "loaded": 2, "loading": 0, "cold": TYPES - 3,
                         "broken": 1, "cold_starts": 2, "evictions": 0, "max_loaded": 128,
                         "evicted_for_room": 0, "refused_at_cap": 0, "broken_retries": 0}
        metrics = (await client.get("/metrics")).text
        assert f'envfarm_env_types{{owner="{core.owner}",state="loaded"}} 2.0' in metrics
        assert f'envfarm_env_cold_starts_total{{owner="{core.owner}"}} 2.0' in metrics


async def test_the_cap_evicts_the_least_recently_used_idle_type_and_refuses_when_all_in_use(
        catalog_100):
    catalog, names = catalog_100
    a, b, c, d = names[10:14]
    # In process: the cap is the registry's (workers stopping on eviction: tested above).
    core = _core(catalog, max_loaded_types=2, evict_idle_s=3600, isolation="in_process")
    await core.start()
    try:
        await core.warm(a)
        await core.warm(b)
        used = await core.create_lease(a, LeaseRequest())  # a is now the more recent one
        core.release(a, used.lease_id, used.token)
        await core.warm(c)  # one over the cap: b, idle the longest, makes room
        assert set(core.envs) == {a, c} and core.registry.state(b) is EnvState.cold
        counts = core.registry.counts()
        assert (counts.max_loaded, counts.evicted_for_room, counts.evictions) == (2, 1, 1)

        held = [await core.create_lease(n, LeaseRequest()) for n in (a, c)]
        with pytest.raises(TooManyTypesLoaded) as err:  # both in use: nothing can go
            await core.create_lease(d, LeaseRequest())
        assert err.value.retry_after_s > 0 and err.value.max_loaded == 2
        assert set(core.envs) == {a, c} and core.registry.counts().refused_at_cap == 1
        metrics = core.metrics.render().decode()
        assert f'envfarm_env_refused_at_cap_total{{owner="{core.owner}"}} 1.0' in metrics
        assert f'envfarm_env_types_max_loaded{{owner="{core.owner}"}} 2.0' in metrics

        core.release(c, held[1].lease_id, held[1].token)  # c is idle again: d takes its place
        info = await core.create_lease(d, LeaseRequest())
        assert set(core.envs) == {a, d} and info.env == d
    finally:
        await core.aclose()


def _set_code(folder: Path, name: str, code: str | None) -> None:
    """Rewrite ``name``'s record in gen_envs.jsonl (None: remove it)."""
    path = folder / "gen_envs.jsonl"
    rows = [r for r in map(json.loads, path.read_text().splitlines()) if r["scenario"] != name]
    if code is not None:
        rows.append({"scenario": name, "db_path": f"{name}.db", "full_code": code})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


async def test_a_broken_type_is_retried_after_its_backoff_and_when_the_catalog_changes(
        tmp_path):
    names = make_catalog(tmp_path, types=17, broken=1)  # 17: on demand by default
    broken, fine = names[-1], names[0]
    core = _core(load_catalog(tmp_path, check_code=False), broken_retry_s=0.2,
                 isolation="in_process")
    core.loader.catalog_stat_every_s = 0.0
    await core.start()
    try:
        with pytest.raises(EnvBroken) as first:
            await core.create_lease(broken, LeaseRequest())
        assert first.value.retry_after_s == pytest.approx(0.2)
        await asyncio.sleep(0.25)  # past the backoff: loaded again, fails again, waits longer
        with pytest.raises(EnvBroken, match="broken on purpose") as second:
            await core.create_lease(broken, LeaseRequest())
        assert second.value.retry_after_s == pytest.approx(0.4)
        assert core.registry.counts().broken_retries == 1
        assert core.registry.broken[broken].failures == 2
        assert sum(p.startswith(f"{broken}: ") for p in core.problems) == 1

        # Changed on disk but still not servable: re-read once at once, then it waits again
        # (an unreadable change is not re-read at every request).
        _set_code(tmp_path, broken, None)
        for _ in range(2):
            with pytest.raises(EnvBroken, match="no code to serve in the changed catalog"):
                await core.create_lease(broken, LeaseRequest())
        assert core.registry.counts().broken_retries == 2

        # Fixed on disk: the next request loads it at once, inside its backoff.
        _set_code(tmp_path, broken, core.catalog[fine].code)
        info = await core.create_lease(broken, LeaseRequest())
        assert info.env == broken and core.registry.state(broken) is EnvState.loaded
        counts = core.registry.counts()
        assert (counts.broken, counts.broken_retries) == (0, 3)
        assert not any(p.startswith(f"{broken}: ") for p in core.problems)
        assert core.catalog[fine].code == core.catalog[broken].code
        core.release(broken, info.lease_id, info.token)
    finally:
        await core.aclose()


async def test_warming_takes_the_farm_api_key_like_lease_creation(catalog_100):
    """The attack: anyone who reaches a keyed farm makes it cold-start types (a worker each)
    by POSTing /warm. Refused before anything loads; a tenant's key warms."""
    catalog, names = catalog_100
    key = "efk_" + "k" * 40
    tenants = TenantsConfig(require_key=True,
                            tenants=[Tenant(name="trainer", key_sha256=hash_key(key))])
    core = _core(catalog, tenants=tenants, isolation="in_process")  # the route is the same
    app = build_app(core)
    env = names[20]
    async with lifespan_running(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://farm") as client:
        for headers, status, kind in (({}, 401, "KeyMissing"),
                                      ({"X-Envfarm-Key": "efk_guess"}, 403, "KeyInvalid")):
            r = await client.post(f"/envs/{env}/warm", headers=headers)
            assert (r.status_code, r.json()["error"]["type"]) == (status, kind)
        r = await client.post(f"/envs/{names[-1]}/warm")  # nor does a broken type's load run
        assert r.status_code == 401
        counts = core.registry.counts()
        assert (counts.loaded, counts.loading, counts.cold_starts, counts.broken) == (0, 0, 0, 0)

        async with Farm("http://farm", transport=ASGITransport(app), api_key=key) as sdk:
            assert [d.state for d in await sdk.warm(env)] == [EnvState.loaded]
        assert core.registry.counts().cold_starts == 1
