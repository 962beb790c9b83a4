"""What an episode's requests cost the farm, route by route (issue 24): CPU per request of the
``--no-ray`` farm's front, its env workers and its verifier sandbox, for lease + release, the
tool listing, a tool call and a verify, each driven alone at 32 in flight.

An episode of the rollout benchmark is a lease, the tool listing, ~3 tool calls, a verify and a
release; this says which of them the farm's CPU per episode goes to.

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/farm/bench_episode_cost.py'
Raw results: benchmarks/results/episode_cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.trainer.bench_rollout import start_no_ray, tree_cpu

from envfarm import load_catalog
from envfarm.client import AiohttpTransport, Farm

OUT = REPO / "benchmarks" / "results" / "episode_cost.json"
IN_FLIGHT = 32


async def measure(pid: int, n: int, make: Any) -> dict[str, float]:
    """CPU µs per request by role over ``n`` requests of ``make(i)``, IN_FLIGHT at a time."""
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> None:
        async with sem:
            await make(i)

    before, t0 = tree_cpu(pid), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall, after = time.perf_counter() - t0, tree_cpu(pid)
    out = {role: round((after[role] - before.get(role, 0.0)) / n * 1e6, 1) for role in after}
    return {**out, "all": round(sum(out.values()), 1), "per_s": round(n / wall, 1)}


async def run_round(url: str, pid: int, env: str, task: int, calls: list, n: int) -> dict:
    async with Farm(url, transport=AiohttpTransport(url, max_connections=4 * IN_FLIGHT)) as farm:
        async def lease_release(_: int) -> None:
            lease = await farm.acquire(env, task_idx=task)
            await lease.release()

        held = [await farm.acquire(env, task_idx=task) for _ in range(IN_FLIGHT)]
        try:
            for lease in held:  # the episode's changes: the verify compares two databases
                for call in calls:
                    await lease.call_result(call.tool, call.arguments)
            first = calls[0]
            return {
                "lease + release": await measure(pid, n, lease_release),
                "tool listing": await measure(
                    pid, n, lambda i: held[i % IN_FLIGHT].tools()),
                f"tool call ({first.tool})": await measure(
                    pid, n, lambda i: held[i % IN_FLIGHT].call_result(first.tool,
                                                                      first.arguments)),
                "verify": await measure(
                    pid, n // 2, lambda i: held[i % IN_FLIGHT].verify(task, "The task is done.")),
            }
        finally:
            for lease in held:
                await lease.release()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="hotel_booking_1")
    ap.add_argument("--n", type=int, default=800, help="requests per route and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=OUT)
    args = ap.parse_args()
    catalog = load_catalog()
    bundle = catalog[args.env]
    task = min(i for i in bundle.solutions if i in bundle.code_verifiers)
    proc, url = start_no_ray(warm=2 * IN_FLIGHT, verifier_workers=2)
    try:
        rounds = [asyncio.run(run_round(url, proc.pid, args.env, task, bundle.solutions[task],
                                        args.n)) for _ in range(args.rounds)]
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    median: dict[str, Any] = {}
    for route in rounds[0]:
        median[route] = {k: sorted(r[route][k] for r in rounds)[len(rounds) // 2]
                         for k in rounds[0][route]}
    res = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "loadavg": os.getloadavg(),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
           "env": args.env, "task": task, "in_flight": IN_FLIGHT, "median": median,
           "rounds": rounds}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    for route, m in median.items():
        print(f"{route:32s} " + "  ".join(f"{k} {v}" for k, v in m.items()))


if __name__ == "__main__":
    main()
