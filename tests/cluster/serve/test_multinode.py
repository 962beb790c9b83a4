"""The farm on a multi-node Ray cluster on this machine, deployed from k8s/rayservice.yaml.

A head (the controller, no CPUs: no pool replicas) and three one-CPU workers, each its own
raylet with its own HAProxy ingress port; the manifest's Serve config (one env kept, sizes
scaled: cluster/local_cluster.py ``fit_to_machine``) PUT to the head's dashboard as KubeRay
does. A pool replica reserves one CPU, so the two replicas sit on two different workers and a
third (autoscaled) one can only go to the third. Every answer is counted; a lease never reads
a state it did not write.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections import Counter

import httpx
import pytest

from tests.cluster.serve._traffic import (
    Tally,
    acquire,
    auth,
    check,
    churn,
    lease_path,
    owner,
    write,
)
from tests.cluster.serve.conftest import ENV

pytestmark = [
    pytest.mark.ray,
    pytest.mark.multinode,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning"),
]

APP = f"env-{ENV}"
#: The manifest's autoscaling for this env (min 2, max 8, 64 ongoing requests per replica)
#: made small and fast for a 2-core machine: 2 to 3 replicas, scaling within seconds.
AUTOSCALING = {"min_replicas": 2, "max_replicas": 3, "target_ongoing_requests": 2,
               "metrics_interval_s": 0.5, "look_back_period_s": 1.0,
               "upscale_delay_s": 1.0, "downscale_delay_s": 2.0}
#: Node loss noticed in ~3 s instead of Ray's ~15 s default (one raylet health check a second).
FAST_NODE_DEATH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@pytest.fixture(scope="module")
def cluster(bundled_catalog):
    if {name for _, name in socket.if_nameindex()} - {"lo"}:
        pytest.skip("Ray tests run inside a private network namespace: "
                    "unshare --net sh -c 'ip link set lo up && exec pytest ...'")
    from cluster.local_cluster import (
        deploy,
        fit_to_machine,
        load_manifest,
        manifest_serve_config,
        start_cluster,
    )

    manifest = load_manifest()
    local = start_cluster(3, manifest=manifest, system_config=FAST_NODE_DEATH)
    try:
        deploy(local, fit_to_machine(manifest_serve_config(manifest), envs=[ENV],
                                     port=local.head.port, autoscaling=AUTOSCALING),
               envs=[ENV])
        yield local
    finally:
        local.shutdown()


# -- where things run --------------------------------------------------------------------------
def pool_replicas() -> dict[str, dict]:
    """owner tag -> whoami (node, pid, leases) of every running pool replica."""
    from ray import serve

    handle = serve.get_deployment_handle("pool", app_name=APP)
    running = serve.status().applications[APP].deployments["pool"].replica_states.get(
        "RUNNING", 0)
    out: dict[str, dict] = {}
    for i in range(running):
        who = handle.whoami.remote(owner=f"#{i}").result(timeout_s=30)
        out[who["owner"]] = who
    return out


def calls_by_owner() -> dict[str, int]:
    """owner -> tool calls it served (each replica's own counter, read by handle)."""
    from ray import serve

    handle = serve.get_deployment_handle("pool", app_name=APP)
    out = {}
    for owner_tag in pool_replicas():
        text = handle.metrics_text.remote(owner=owner_tag).result(timeout_s=30).decode()
        out[owner_tag] = int(sum(float(v) for v in re.findall(
            r"^envfarm_calls_total\{[^}]*\} (\S+)$", text, re.MULTILINE)))
    return out


def ingress_urls(cluster) -> dict[str, str]:
    """node id -> ingress URL of every node whose HAProxy runs."""
    from cluster.local_cluster import ingress_nodes

    return {n.node_id: n.url for n in ingress_nodes(cluster)}


async def wait_replicas(n: int, timeout_s: float) -> float:
    from ray import serve

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        states = serve.status().applications[APP].deployments["pool"].replica_states
        if states.get("RUNNING", 0) == n and sum(states.values()) == n:
            return time.monotonic() - t0
        await asyncio.sleep(0.25)
    pytest.fail(f"pool did not reach {n} replicas in {timeout_s} s")


# -- the tests (in order: the last one kills a node) --------------------------------------------
async def test_replicas_spread_over_worker_nodes(cluster):
    replicas = await asyncio.to_thread(pool_replicas)
    nodes = {r["node"] for r in replicas.values()}
    assert len(replicas) == 2 and len(nodes) == 2, replicas
    assert cluster.head.node_id not in nodes  # the head has no CPUs: controller and ingress
    assert nodes <= {w.node_id for w in cluster.workers}


async def test_leases_cross_nodes_and_calls_reach_their_owner(cluster):
    """Leases made through each node's ingress; their calls sent through the other nodes'
    ingress; each owner served exactly the calls of its own leases."""
    urls = await asyncio.to_thread(ingress_urls, cluster)
    assert len(urls) >= 2, urls
    replicas = await asyncio.to_thread(pool_replicas)
    node_of = {o: r["node"] for o, r in replicas.items()}
    before = await asyncio.to_thread(calls_by_owner)
    tally, made, sent = Tally(), {}, Counter()
    clients = {n: httpx.AsyncClient(base_url=u, timeout=30, headers=cluster.key_header)
               for n, u in urls.items()}
    try:
        for via, c in clients.items():
            made[via] = [await acquire(c, tally) for _ in range(8)]
            assert all(made[via]), tally.summary()
        order = list(clients)
        for k, (via, infos) in enumerate(made.items()):
            others = [clients[n] for n in order if n != via]
            for j, info in enumerate(infos):  # write through one node, read through another
                assert await write(others[j % len(others)], info, tally)
                assert await check(clients[order[(k + j + 1) % len(order)]], info, tally) == 200
                sent[owner(info)] += 2
    finally:
        for c in clients.values():
            await c.aclose()
    after = await asyncio.to_thread(calls_by_owner)
    print(f"\nmulti-node routing over {len(urls)} ingress nodes: {tally.summary()}")

    assert not tally.ours_5xx and not tally.proxy_5xx and not tally.transport, tally.summary()
    assert not tally.wrong_state, tally.wrong_state[:5]
    leases = sum(len(v) for v in made.values())
    assert tally.statuses == Counter({201: leases, 200: 2 * leases})
    for via, infos in made.items():  # every ingress node put leases on another node's replica
        assert any(node_of[owner(i)] != via for i in infos), via
    assert {o: after[o] - before.get(o, 0) for o in after} == {o: sent[o] for o in after}


async def test_status_page_lists_replicas_per_node(cluster):
    url = next(iter((await asyncio.to_thread(ingress_urls, cluster)).values()))
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        status = (await c.get("/status.json")).json()
        page = (await c.get("/status")).text
        # deployed beyond loopback: no lease without a tenant's key (the pods' Secret)
        keyless = await c.post(f"/envs/{ENV}/leases", json={})
        forged = await c.post(f"/envs/{ENV}/leases", json={}, headers={"X-Envfarm-Key": "efk_x"})
    assert (keyless.status_code, forged.status_code) == (401, 403), (keyless.text, forged.text)
    replicas = await asyncio.to_thread(pool_replicas)
    listed = {r["owner"]: r["node"] for r in status["replicas"]}
    assert listed == {o: r["node"] for o, r in replicas.items()}
    assert [r["node"] for r in status["replicas"]] == sorted(listed.values())  # grouped
    assert '<th class="text">node</th>' in page and "on ${nodes} nodes" in page


async def test_trainer_actor_on_one_node_drives_episodes_on_others(cluster, tmp_path_factory):
    """The GRPO trainer actor, pinned to the head (no pool replicas there), runs a step whose
    episodes are served by replicas on the worker nodes."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from trainer.actor import SOURCE_ROOT, TrainerActor
    from trainer.config import TrainConfig
    from trainer.tiny_model import tiny_model_path

    cache = tmp_path_factory.getbasetemp().parent / "envfarm-cache"
    await asyncio.to_thread(tiny_model_path, cache_dir=cache)
    config = TrainConfig(envs=[ENV], tasks=[0], batch_size=1, group_size=2, guide_fraction=0.5,
                         max_turns=4, max_new_tokens=8, max_tool_chars=300,
                         tool_listing="compact", lr=1e-3, micro_batch=4, concurrency=4,
                         threads=1, steps=1, out_dir=str(tmp_path_factory.mktemp("run")))
    before = await asyncio.to_thread(calls_by_owner)
    url = next(iter((await asyncio.to_thread(ingress_urls, cluster)).values()))
    actor = TrainerActor.options(
        num_cpus=0, runtime_env={"env_vars": {"PYTHONPATH": SOURCE_ROOT,
                                              "ENVFARM_CACHE": str(cache),
                                              "ENVFARM_API_KEY": cluster.api_key}},
        scheduling_strategy=NodeAffinitySchedulingStrategy(cluster.head.node_id, soft=False),
    ).remote(config.model_dump(), url)
    record = await actor.train_step.remote()
    from ray.util.state import get_actor

    actor_node = get_actor(actor._actor_id.hex()).node_id
    ray.kill(actor)
    after = await asyncio.to_thread(calls_by_owner)
    replicas = await asyncio.to_thread(pool_replicas)
    served = {o: after[o] - before.get(o, 0) for o in after if after[o] > before.get(o, 0)}
    assert actor_node == cluster.head.node_id
    assert record["episodes"] == 2 and record["guided_episodes"] == 1
    assert served, "no pool replica served the trainer's calls"
    assert all(replicas[o]["node"] != actor_node for o in served)


async def test_autoscaling_adds_a_replica_on_another_node(cluster):
    """A load step scales the pool 2 -> 3 replicas, the new one on the worker that had none;
    after the load it goes back to 2. Leases made before keep their state; leases of the
    replica that stopped answer a typed 410, never a fresh state."""
    urls = list((await asyncio.to_thread(ingress_urls, cluster)).values())
    before = await asyncio.to_thread(pool_replicas)
    tally, stop, held = Tally(), asyncio.Event(), []
    clients = [httpx.AsyncClient(base_url=u, timeout=30, limits=httpx.Limits(max_connections=40),
                                 headers=cluster.key_header)
               for u in urls]
    try:
        early = [await acquire(clients[i % len(clients)], tally) for i in range(6)]
        assert all(early) and all([await write(clients[0], i, tally) for i in early])
        held += early
        workers = [asyncio.create_task(churn(clients[k % len(clients)], tally, stop, held))
                   for k in range(32)]
        up_s = await wait_replicas(3, timeout_s=60)
        grown = await asyncio.to_thread(pool_replicas)
        await asyncio.sleep(1.0)  # traffic on the new replica
        stop.set()
        await asyncio.gather(*workers)
        for info in early:
            assert await check(clients[-1], info, tally) == 200
        down_s = await wait_replicas(2, timeout_s=60)
        after = await asyncio.to_thread(pool_replicas)
        final = Tally()
        answers = {i["lease_id"]: await check(clients[0], i, final) for i in held}
        fresh = [await acquire(clients[-1], final) for _ in range(4)]
        assert all(fresh) and all([await write(clients[0], i, final) for i in fresh])
        for info in [*held, *fresh]:  # the next test starts from empty replicas
            if answers.get(info["lease_id"], 200) == 200:
                await clients[0].delete(lease_path(info), headers=auth(info))
    finally:
        for c in clients:
            await c.aclose()
    print(f"\nmulti-node autoscaling: up in {up_s:.1f} s, down in {down_s:.1f} s; "
          f"{tally.summary()}; after: {final.summary()}")

    (new,) = set(grown) - set(before)
    assert grown[new]["node"] not in {r["node"] for r in before.values()}
    for t in (tally, final):
        assert not t.ours_5xx and not t.transport and not t.wrong_state, t.summary()
    stopped = set(grown) - set(after)
    assert len(stopped) == 1
    for lease_id, code in answers.items():
        assert code == (410 if lease_id.split("-")[0] in stopped else 200), lease_id
    assert {final.gone[lid] for lid in final.gone} <= {"gone"}
    assert {owner(i) for i in fresh} <= set(after)


async def test_killed_worker_node_gives_410_and_the_others_go_on(cluster):
    """SIGKILL every process of a worker node that holds a pool replica (not the Door or the
    front): its leases answer 410, the other leases never notice, new leases go to replicas on
    the surviving nodes."""
    from cluster.local_cluster import actor_nodes, deploy, fit_to_machine

    # Three replicas on the three workers (a config update, PUT as KubeRay applies one): the
    # Door and the front, one replica each, cannot share a node with all three.
    await asyncio.to_thread(deploy, cluster, fit_to_machine(
        cluster.config, envs=[ENV], port=cluster.head.port,
        autoscaling={"min_replicas": 3, "max_replicas": 3}), envs=[ENV])
    await wait_replicas(3, timeout_s=60)
    replicas = await asyncio.to_thread(pool_replicas)
    shared = actor_nodes(f"SERVE_REPLICA::{APP}#door") | actor_nodes("SERVE_REPLICA::envfarm#")
    victims = [w for w in cluster.workers
               if w.node_id in {r["node"] for r in replicas.values()} - shared]
    assert victims, "every pool replica shares its node with the Door or the front"
    victim = victims[0]
    lost_owner = next(o for o, r in replicas.items() if r["node"] == victim.node_id)
    urls = [u for n, u in (await asyncio.to_thread(ingress_urls, cluster)).items()
            if n != victim.node_id]
    tally, stop = Tally(), asyncio.Event()
    async with httpx.AsyncClient(base_url=urls[0], timeout=30, headers=cluster.key_header) as c:
        infos: list[dict] = []
        while min(Counter(owner(i) for i in infos).get(o, 0) for o in replicas) < 4:
            assert len(infos) < 60, Counter(owner(i) for i in infos)
            info = await acquire(c, tally)
            assert info and await write(c, info, tally), tally.summary()
            infos.append(info)

        async def traffic(info: dict) -> list[int]:
            codes: list[int] = []
            while not stop.is_set() and (not codes or codes[-1] != 410):
                codes.append(await check(c, info, tally))
                await asyncio.sleep(0.05)
            return codes

        flows = [asyncio.create_task(traffic(i)) for i in infos]
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        await asyncio.to_thread(cluster.kill_worker, victim)
        lost = [f for f, i in zip(flows, infos) if owner(i) == lost_owner]
        while not all(f.done() for f in lost):
            assert time.monotonic() - t0 < 60, f"lost leases never got 410: {tally.summary()}"
            await asyncio.sleep(0.2)
        gone_s = time.monotonic() - t0
        await asyncio.sleep(0.5)
        stop.set()
        codes = dict(zip((i["lease_id"] for i in infos), await asyncio.gather(*flows)))
        fresh = [await acquire(c, tally) for _ in range(6)]
        assert all(fresh) and all([await write(c, i, tally) for i in fresh])
    print(f"\nworker node killed: all its leases 410 in {gone_s:.1f} s; {tally.summary()}")

    assert not tally.wrong_state and not tally.transport and not tally.proxy_5xx, tally.summary()
    for lease_id, seen in codes.items():
        if lease_id.split("-")[0] == lost_owner:
            # While Ray has not yet declared the node dead, the Door answers a typed,
            # retryable 503 (the owner is unreachable, maybe alive); then 410 for good.
            assert seen[-1] == 410 and set(seen) <= {200, 503, 410}, seen
        else:
            assert set(seen) == {200}, (lease_id, seen)
    assert all(e.startswith("503") and "unavailable" in e for e in tally.ours_5xx), tally.ours_5xx
    assert {lid.split("-")[0] for lid in tally.gone} == {lost_owner}
    assert set(tally.gone.values()) == {"gone"}
    assert lost_owner not in {owner(i) for i in fresh}
