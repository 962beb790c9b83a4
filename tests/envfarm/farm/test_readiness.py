"""Readiness: /healthz (and the status page) say ready only when every env is routable with
warm instances; before that /healthz answers 503 with Retry-After (what probes read). And draining, the first
step of a stop: requests in flight are answered, new ones refused 503."""

from __future__ import annotations

import asyncio
import json

import httpx

from envfarm.farm import Health, PoolConfig, build_app, health_response
from tests.envfarm.farm.conftest import ENV, farm_client, lifespan_running


async def test_ready_when_every_env_has_warm_instances(core):
    async with farm_client(core) as c:
        r = await c.get("/healthz")
        assert r.status_code == 200
        assert r.json()["ready"] is True and r.json()["waiting_for"] == []
        assert (await c.get("/status.json")).json()["ready"] is True


def test_not_ready_answers_503_with_retry_after():
    # what the Serve front answers until every env's app runs and answers (tests/envfarm/
    # serve/test_serve_farm.py checks the ready side on a real farm)
    health = Health(ready=False, status="starting", waiting_for=["app env-x: DEPLOYING"],
                    owner="front", envs=["x"], leases_active=0, free_instances=0)
    r = health_response(health)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert json.loads(r.body)["waiting_for"] == ["app env-x: DEPLOYING"]
    assert health_response(health.model_copy(update={"ready": True})).status_code == 200


async def test_a_busy_farm_stays_ready(make_core):
    core = make_core(pool=PoolConfig(warm=1, max_instances=1))
    async with farm_client(core) as c:
        assert (await c.post(f"/envs/{ENV}/leases", json={})).status_code == 201
        assert (await c.post(f"/envs/{ENV}/leases", json={})).status_code == 503  # full
        assert (await c.get("/healthz")).json()["ready"] is True  # full is not starting


async def test_draining_answers_in_flight_requests_and_refuses_new_ones(core):
    app = build_app(core)
    async with lifespan_running(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://farm") as c:
        info = (await c.post(f"/envs/{ENV}/leases", json={})).json()
        instance = core.leases[info["lease_id"]].instance
        await instance.lock.acquire()  # a call of this lease is running
        call = asyncio.create_task(c.post(
            f"/envs/{ENV}/leases/{info['lease_id']}/call", json={"tool": "list_wishlists"},
            headers={"Authorization": f"Bearer {info['token']}"}))
        await asyncio.sleep(0.05)
        drained = asyncio.create_task(app.state.drain.drain(timeout_s=5))
        await asyncio.sleep(0.05)
        refused = await c.get("/healthz")
        assert refused.status_code == 503 and refused.headers["Connection"] == "close"
        assert refused.json()["error"]["type"] == "FarmNotReady"
        assert not drained.done()  # still waiting for the call
        instance.lock.release()
        assert (await call).json()["ok"] is True
        assert await drained == 0
