"""Bad input and faults at the lease API: every one gets a clear typed answer, never a 5xx."""

from __future__ import annotations

import asyncio
import time

import pytest

from envfarm.farm import LeasePolicy, PoolConfig, build_app
from tests.envfarm.farm.conftest import ENV, farm_client, new_lease


async def test_unknown_env_and_lease(client):
    r = await client.post("/envs/no_such_env/leases", json={})
    assert r.status_code == 404 and r.json()["error"]["kind"] == "not_found"
    _, auth, info = await new_lease(client)
    owner = info["lease_id"].split("-")[0]
    r = await client.get(f"/envs/{ENV}/leases/{owner}-00ff/tools", headers=auth)
    assert r.status_code == 404


async def test_token_missing_wrong(client):
    path, _, _ = await new_lease(client)
    r = await client.get(path + "/tools")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = await client.get(path + "/tools", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 403 and r.json()["error"]["kind"] == "forbidden"
    r = await client.get(path + "/tools", headers={"Authorization": "Basic abc"})
    assert r.status_code == 401


async def test_lease_of_another_owner_is_gone(client):
    _, auth, _ = await new_lease(client)
    r = await client.get(f"/envs/{ENV}/leases/deadreplica-0123abcd/tools", headers=auth)
    assert r.status_code == 410
    assert "deadreplica" in r.json()["error"]["message"]


async def test_malformed_json_and_schema_errors(client):
    path, auth, _ = await new_lease(client)
    r = await client.post(path + "/call", headers={**auth, "content-type": "application/json"},
                          content=b"{not json")
    assert r.status_code == 422 and r.json()["error"]["kind"] == "invalid_request"
    r = await client.post(path + "/call", headers=auth, json={"arguments": {}})
    assert r.status_code == 422
    r = await client.post(f"/envs/{ENV}/leases", json={"ttl_s": -1})
    assert r.status_code == 422
    r = await client.post(path + "/call", headers=auth, json={"tool": "nope"})
    assert r.status_code == 200 and r.json()["error"]["kind"] == "agent_error"


async def test_body_over_one_mib_is_413(client):
    path, auth, _ = await new_lease(client)
    big = {"tool": "create_wishlist", "arguments": {"name": "x" * (1 << 20)}}
    r = await client.post(path + "/call", headers=auth, json=big)
    assert r.status_code == 413 and r.json()["error"]["kind"] == "invalid_request"

    async def chunks():  # no content-length: counted while streaming
        for _ in range(20):
            yield b"x" * 65536

    r = await client.post(path + "/call", headers=auth, content=chunks())
    assert r.status_code == 413


async def test_expired_lease_is_gone_and_reaped(make_core):
    core = make_core(leases=LeasePolicy(reap_interval_s=0.05))
    async with farm_client(core) as client:
        if True:
            path, auth, _ = await new_lease(client, ttl_s=0.1)
            assert (await client.get(path + "/tools", headers=auth)).status_code == 200
            await asyncio.sleep(0.15)
            r = await client.get(path + "/tools", headers=auth)
            assert r.status_code == 410 and "expired" in r.json()["error"]["message"]
            assert core.envs[ENV].pool.stats().leased == 0


async def test_idle_leases_are_reaped(make_core):
    core = make_core(leases=LeasePolicy(idle_timeout_s=5))
    await core.create_lease(ENV, __import__("envfarm.farm", fromlist=["LeaseRequest"]).LeaseRequest())
    assert core.reap(now_mono=time.monotonic() + 1) == 0
    assert core.reap(now_mono=time.monotonic() + 10) == 1
    assert not core.leases and core.envs[ENV].pool.stats().leased == 0


async def test_full_pool_is_503(make_core):
    import httpx

    core = make_core(pool=PoolConfig(warm=1, max_instances=2))
    app = build_app(core)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://farm") as client:
        for _ in range(2):
            await new_lease(client)
        r = await client.post(f"/envs/{ENV}/leases", json={})
        assert r.status_code == 503 and r.json()["error"]["kind"] == "unavailable"


async def test_broken_verifier_gives_invalid_reward(make_core, bundled_catalog):
    bundle = bundled_catalog[ENV]
    broken = bundle.code_verifiers[0].model_copy(update={"code": "def verify_task_completion("
                                                         "a, b, c=None):\n    raise ValueError"})
    catalog = type(bundled_catalog)({**bundled_catalog.bundles, ENV: bundle.model_copy(
        update={"code_verifiers": {**bundle.code_verifiers, 0: broken}})},
        bundled_catalog.problems, bundled_catalog.root)
    from cluster.compose import compose_core
    from envfarm.farm import FarmConfig

    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1)), catalog=catalog,
                    runtimes={ENV: make_core().envs[ENV].runtime})
    async with farm_client(core) as client:
        if True:
            path, auth, _ = await new_lease(client, task_idx=0)
            v = (await client.post(path + "/verify", headers=auth)).json()
    assert v["reward"] is None and v["valid"] is False and v["outcome"] == "invalid"


@pytest.mark.parametrize("method,suffix", [("get", "/tools"), ("post", "/reset"),
                                           ("delete", ""), ("get", "/snapshot")])
async def test_every_lease_route_needs_the_token(client, method, suffix):
    path, _, _ = await new_lease(client)
    r = await getattr(client, method)(path + suffix)
    assert r.status_code == 401
