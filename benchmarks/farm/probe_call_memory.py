"""Where a farm replica's memory goes per call: RSS and Python's traced heap, in one process.

The soak saw pool replicas' RSS grow under steady calls. This runs ``FarmCore.call`` (no Ray,
no HTTP) on 16 leases in rounds and reports RSS per round, then the Python heap (tracemalloc)
kept across 2,400 calls once the guard watchdog's 10 s deadlines have passed: if RSS grows and
the traced heap does not, the growth is outside Python objects (C allocations).

Each call yields to the event loop once, as a server's calls do. Without that the loop never
runs an iteration, so it never purges the cancelled timer of each call's ``asyncio.timeout``:
an earlier version of this probe measured exactly that (~1 KiB per call, linear), not the farm.

    python benchmarks/farm/probe_call_memory.py --json benchmarks/results/call_memory.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
import tracemalloc

import psutil

from cluster.compose import compose_core
from envfarm.farm import FarmConfig, LeaseRequest, PoolConfig

ENV = "hotel_booking_1"


async def _calls(core, leases, rounds: int) -> None:
    for _ in range(rounds):
        for lease in leases:
            await core.call(lease, "list_wishlists", {})
            await asyncio.sleep(0)  # one loop iteration, as between a server's requests


async def probe(rss_rounds: int, isolation: str = "in_process", n_leases: int = 16) -> dict:
    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=8), isolation=isolation),
                        owner="probe")
    leases = [core.leases[(await core.create_lease(ENV, LeaseRequest())).lease_id]
              for _ in range(n_leases)]
    for lease in leases:
        await core.call(lease, "create_wishlist", {"name": lease.lease_id})
    rss = []
    per_round = 100 * len(leases)
    for _ in range(rss_rounds):  # 100 calls per lease per round
        t0 = time.perf_counter()
        await _calls(core, leases, 100)
        gc.collect()
        rss.append({"calls": per_round, "s": round(time.perf_counter() - t0, 2),
                    "rss_mib": round(psutil.Process().memory_info().rss / 2**20, 1)})
    await asyncio.sleep(11)  # past the guards' 10 s deadlines (the watchdog holds them till then)
    gc.collect()
    tracemalloc.start(8)
    before = tracemalloc.take_snapshot()
    rss_before = psutil.Process().memory_info().rss
    traced_rounds = max(1, 2400 // len(leases))
    await _calls(core, leases, traced_rounds)
    await asyncio.sleep(11)
    gc.collect()
    diff = tracemalloc.take_snapshot().compare_to(before, "traceback")
    rss_after = psutil.Process().memory_info().rss
    top = [{"bytes": d.size_diff, "count": d.count_diff,
            "where": d.traceback.format()[-2].strip()} for d in diff[:5]]
    first, last = rss[0]["rss_mib"], rss[-1]["rss_mib"]
    half = len(rss) // 2  # past the watchdog's 10 s window of guards
    return {"rss_by_round": rss,
            "leases": len(leases),
            "rss_growth_bytes_per_call": round((last - first) * 2**20 / (per_round * (len(rss) - 1))),
            "rss_growth_bytes_per_call_second_half": round(
                (last - rss[half]["rss_mib"]) * 2**20 / (per_round * max(1, len(rss) - 1 - half))),
            "traced": {"calls": traced_rounds * len(leases),
                       "python_heap_growth_bytes": sum(d.size_diff for d in diff),
                       "rss_growth_bytes": rss_after - rss_before, "top": top}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=24)
    p.add_argument("--json", default=None)
    p.add_argument("--leases", type=int, default=16)
    p.add_argument("--isolation", choices=("in_process", "workers"), default="in_process",
                   help="workers: env code in its confined worker processes (a Serve replica's "
                   "way); the RSS is this process's, the front's")
    args = p.parse_args()
    out = asyncio.run(probe(args.rounds, args.isolation, args.leases))
    out["isolation"] = args.isolation
    text = json.dumps(out, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
