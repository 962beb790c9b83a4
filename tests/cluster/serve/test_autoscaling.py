"""Autoscaling under load, and HAProxy reloading its config while traffic flows.

A pool with ``autoscaling_config`` (1 to 2 replicas) gets a load step: it scales up, leases made
before keep their state, and calls keep flowing while an app is deployed and deleted (each a
HAProxy reload). Load stops: it scales down; leases of the stopped replica answer a typed 410,
never a fresh state; leases of the survivor and new leases work. Every answer is counted.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import psutil
import pytest

from tests.cluster.serve._traffic import Tally, acquire, check, churn, owner, write
from tests.cluster.serve.conftest import ENV

pytestmark = [
    pytest.mark.ray,
    # Serve 2.60 calls metrics_interval_s deprecated in favour of env vars it does not read yet
    # (RAY_SERVE_*_AUTOSCALING_METRIC_PUSH_INTERVAL_S): the field still sets the metrics period.
    pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning"),
]

APP = f"env-{ENV}"
WORKERS = 48


def running_replicas() -> int:
    from ray import serve

    app = serve.status().applications[APP]
    return app.deployments["pool"].replica_states.get("RUNNING", 0)


async def wait_replicas(n: int, timeout_s: float) -> float:
    """Seconds until the pool runs exactly ``n`` replicas (fails after ``timeout_s``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if await asyncio.to_thread(running_replicas) == n:
            return time.monotonic() - t0
        await asyncio.sleep(0.25)
    pytest.fail(f"pool did not reach {n} replicas in {timeout_s} s "
                f"(running: {running_replicas()})")


def haproxy_pids() -> set[int]:
    """HAProxy processes of this test's Ray (started under its raylet; other Ray sessions may
    run on the machine)."""
    import ray

    session = ray._private.worker._global_node.get_session_dir_path()
    out = set()
    for p in psutil.process_iter(["name"]):
        if "haproxy" not in (p.info["name"] or ""):
            continue
        try:
            if any(session in " ".join(a.cmdline()) for a in p.parents()):
                out.add(p.pid)
        except psutil.Error:
            continue
    return out


def reload_haproxy_twice() -> None:
    """Deploy an extra app and delete it: HAProxy gets a new backend, then loses it."""
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Blip:
        async def __call__(self, request) -> str:
            return "blip"

    serve.run(Blip.bind(), name="blip", route_prefix="/blip")
    serve.delete("blip")


async def test_pool_scales_up_and_down_under_load(autoscaled_farm):
    from ray import serve

    tally = Tally()
    stop = asyncio.Event()
    held: list[dict] = []  # every lease that wrote its state, never released

    async with httpx.AsyncClient(base_url=autoscaled_farm.url, timeout=30,
                                 limits=httpx.Limits(max_connections=WORKERS + 8)) as c:
        assert await asyncio.to_thread(running_replicas) == 1
        early = [await acquire(c, tally) for _ in range(6)]
        assert all(early) and all([await write(c, i, tally) for i in early])
        held += early
        first_owner = owner(early[0])
        workers = [asyncio.create_task(churn(c, tally, stop, held)) for _ in range(WORKERS)]
        up_s = await wait_replicas(2, timeout_s=40)
        pids_before = haproxy_pids()
        await asyncio.to_thread(reload_haproxy_twice)
        await asyncio.sleep(1.0)  # traffic on both replicas after the reloads
        pids_after = haproxy_pids()
        for info in early:  # leases from before the scale-up kept their state
            assert await check(c, info, tally) == 200
        stop.set()
        await asyncio.gather(*workers)
        calls_under_load = sum(tally.statuses.values())

        # Load gone: back to one replica. Leases made while it scales down must never read
        # another state (a draining replica's included).
        during_down = Tally()
        t0 = time.monotonic()
        while await asyncio.to_thread(running_replicas) != 1:
            assert time.monotonic() - t0 < 40, "pool did not scale down"
            info = await acquire(c, during_down)
            if info and await write(c, info, during_down):
                held.append(info)
                await check(c, info, during_down)
            await asyncio.sleep(0.2)
        down_s = time.monotonic() - t0

        handle = serve.get_deployment_handle("pool", app_name=APP)
        survivor = (await handle.whoami.remote(owner="#0"))["owner"]
        owners = {owner(i) for i in held}
        assert len(owners) == 2 and survivor in owners, (owners, survivor)
        final = Tally()
        answers = {i["lease_id"]: (owner(i), await check(c, i, final)) for i in held}
        fresh = [await acquire(c, final) for _ in range(4)]
        assert all(fresh) and all([await write(c, i, final) for i in fresh])
        assert [await check(c, i, final) for i in fresh] == [200] * 4

    print(f"\nautoscaling: up in {up_s:.1f} s, down in {down_s:.1f} s, {calls_under_load} answers "
          f"under load: {tally.summary()}; during scale-down: {during_down.summary()}; "
          f"after: {final.summary()}; haproxy pids {pids_before} -> {pids_after}")
    for t in (tally, during_down, final):
        assert not t.ours_5xx, t.ours_5xx[:5]
        assert not t.wrong_state, t.wrong_state[:5]
        assert not t.transport, t.transport[:5]
    assert pids_after != pids_before, "deploying and deleting an app did not reload HAProxy"
    assert calls_under_load > 200
    # After scale-down: the survivor's leases serve their own state; the stopped replica's
    # leases answer a typed 410, never a fresh state.
    stopped = [lid for lid, (who, _) in answers.items() if who != survivor]
    assert stopped, "no lease had landed on the replica that was stopped"
    assert {answers[lid][1] for lid in stopped} == {410}
    assert {final.gone[lid] for lid in stopped} == {"gone"}
    assert {code for who, code in answers.values() if who == survivor} == {200}
    assert first_owner in owners
