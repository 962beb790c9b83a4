"""The farm on 1, 2 and 3 Ray nodes of this one machine: what crossing nodes costs.

Same machine, same two logical CPUs and two pool replicas in every layout, so the difference is
the layout, not the capacity:

- 1 node: one raylet with 2 CPUs holds HAProxy, the Door, the front and both replicas;
- 2 nodes: a head with no CPUs (controller, HAProxy, the Door and front where Serve puts them)
  and one 2-CPU worker with both replicas: every call crosses from the head to the worker;
- 3 nodes: the head and two 1-CPU workers, a replica on each;
- ``--baseline`` (reported as nodes 0): 1 node with one replica, its own ingress (no Door), so
  the Door's hop in front of a multi-replica pool is measured in the same run.

Each layout is a fresh cluster (cluster/local_cluster.py), deployed from k8s/rayservice.yaml
(one env, 2 replicas). Through the head's ingress: sequential lease acquire + release (p50/p99
of the acquire) and one tool call per HTTP request from 32 concurrent clients (calls/s, p50,
and the CPU the cluster's processes used: calls/s per core). On the 3-node layout, the pool
replicas' PSS before and after taking ``--leases`` more leases (MiB per lease, leases per GiB).
Layouts run interleaved, ``--rounds`` times; the figures are medians.

Starts Ray: run it inside a private network namespace, e.g.
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/serve/bench_multinode.py'
Raw results: benchmarks/results/multinode.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks._procs import cores_while
from benchmarks.load.bench_farm_load import ENV, acquire, http_calls, lease_latency, session
from cluster.local_cluster import (
    actor_nodes,
    deploy,
    fit_to_machine,
    ingress_nodes,
    load_manifest,
    manifest_serve_config,
    start_cluster,
)

OUT = REPO / "benchmarks" / "results" / "multinode.json"
#: nodes -> start_cluster arguments (2 logical CPUs and so 2 one-CPU replicas in each).
LAYOUTS: dict[int, dict[str, int]] = {
    1: {"workers": 0, "head_cpus": 2},
    2: {"workers": 1, "worker_cpus": 2},
    3: {"workers": 2, "worker_cpus": 1},
}
#: Exactly two replicas in every layout (the manifest autoscales this env from 2 to 8).
TWO_REPLICAS = {"min_replicas": 2, "max_replicas": 2}
#: ``--baseline``: the 1-node layout with one replica, which is its own ingress (no Door):
#: what the Door's hop costs, next to what crossing nodes costs.
BASELINE = 0


def one_replica(config: dict[str, Any]) -> dict[str, Any]:
    """The pool app with a fixed single replica (HAProxy then sends calls straight to it)."""
    for app in config["applications"]:
        deployment = app["args"].get("deployment")
        if deployment is not None:
            deployment.pop("autoscaling_config", None)
            deployment["num_replicas"] = 1
        elif "replicas" in app["args"]:
            app["args"]["replicas"] = {a: 1 for a in app["args"]["replicas"]}
    return config


def pool_pids() -> dict[str, dict[str, Any]]:
    from ray import serve

    handle = serve.get_deployment_handle("pool", app_name=f"env-{ENV}")
    out = {}
    for i in range(2):  # a single replica answers both
        who = handle.whoami.remote(owner=f"#{i}").result(timeout_s=30)
        out[who["owner"]] = who
    return out


def _short(node_id: str) -> str:
    return node_id[:8]


def pss_mib(pids: list[int]) -> float:
    import psutil

    return sum(psutil.Process(p).memory_full_info().pss for p in pids) / 2**20


async def lease_memory(url: str, leases: int, pids: list[int]) -> dict[str, float]:
    before = pss_mib(pids)
    async with session() as s:
        held = [await acquire(s, url) for _ in range(leases)]
        await asyncio.sleep(2)  # the pools refill their warm instances in the background
        after = pss_mib(pids)
    per_lease = (after - before) / len(held)
    return {"leases": len(held), "replicas": len(pids),
            "replica_pss_mib": round(before / len(pids), 1),
            "mib_per_lease": round(per_lease, 3),
            "leases_per_gib": round(1024 / per_lease) if per_lease > 0 else None}


def one_layout(nodes: int, duration_s: float, leases: int) -> dict[str, Any]:
    manifest = load_manifest()
    t0 = time.monotonic()
    cluster = start_cluster(manifest=manifest, **LAYOUTS[max(nodes, 1)])
    os.environ["ENVFARM_API_KEY"] = cluster.api_key  # the clients' tenant key (session())
    try:
        config = fit_to_machine(manifest_serve_config(manifest), envs=[ENV],
                                port=cluster.head.port, autoscaling=TWO_REPLICAS)
        deploy(cluster, one_replica(config) if nodes == BASELINE else config, envs=[ENV])
        startup_s = time.monotonic() - t0
        # The head's HAProxy runs only when Serve placed a replica there (Door, front).
        ingress = ingress_nodes(cluster)[0]
        url = ingress.url
        placement = {"ingress": _short(ingress.node_id),
                     "pool": sorted(_short(w["node"]) for w in pool_pids().values()),
                     **{kind: sorted(_short(n) for n in actor_nodes(prefix))
                        for kind, prefix in (("door", f"SERVE_REPLICA::env-{ENV}#door"),
                                             ("front", "SERVE_REPLICA::envfarm#front"))}}
        lease = asyncio.run(lease_latency(url, n=200))
        me = os.getpid()
        calls, cores = cores_while(lambda: asyncio.run(http_calls(url, 32, duration_s)),
                                   duration_s)
        import psutil

        ours = {p.pid for p in psutil.Process(me).children(recursive=True)}
        farm_cores = sum(c for pid, (_, c) in cores.items() if pid in ours)
        by_kind: dict[str, float] = {}
        for pid, (cmd, c) in cores.items():
            if pid in ours:
                kind = cmd.split()[0].rsplit("/", 1)[-1]
                by_kind[kind] = round(by_kind.get(kind, 0.0) + c, 2)
        top = dict(sorted(by_kind.items(), key=lambda kv: -kv[1])[:6])
        out = {"nodes": nodes, "startup_s": round(startup_s, 1), "placement": placement,
               "lease": lease, "calls": calls, "farm_cores": round(farm_cores, 2),
               "cores_by_process": top,
               "calls_per_s_per_core": round(calls["calls_per_s"] / farm_cores, 1)}
        if nodes == 3 and leases:
            pids = [w["pid"] for w in pool_pids().values()]
            out["memory"] = asyncio.run(lease_memory(url, leases, pids))
        return out
    finally:
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--leases", type=int, default=512)
    parser.add_argument("--nodes", default="1,2,3")
    parser.add_argument("--baseline", action="store_true",
                        help="also 1 node with 1 replica and no Door (reported as nodes 0)")
    args = parser.parse_args()
    layouts = [int(n) for n in args.nodes.split(",")] + ([BASELINE] if args.baseline else [])
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for nodes in layouts:
            run = one_layout(nodes, args.duration, args.leases if r == 0 else 0)
            run["round"] = r
            print(json.dumps(run), flush=True)
            runs.append(run)

    def med(nodes: int, pick) -> float:
        return statistics.median(pick(x) for x in runs if x["nodes"] == nodes)

    summary = {}
    for nodes in layouts:
        summary[nodes] = {
            "calls_per_s": med(nodes, lambda x: x["calls"]["calls_per_s"]),
            "call_p50_ms": med(nodes, lambda x: x["calls"]["p50_ms"]),
            "lease_p50_ms": med(nodes, lambda x: x["lease"]["p50_ms"]),
            "calls_per_s_per_core": med(nodes, lambda x: x["calls_per_s_per_core"]),
        }
    base = summary[1]
    for nodes in layouts:
        s = summary[nodes]
        s["calls_ratio_vs_1_node"] = round(s["calls_per_s"] / base["calls_per_s"], 3)
        s["lease_p50_ratio_vs_1_node"] = round(s["lease_p50_ms"] / base["lease_p50_ms"], 3)
    result = {"machine": f"{platform.node()} {os.cpu_count()} cores", "date":
              time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(args),
              "summary": summary, "runs": runs}
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
