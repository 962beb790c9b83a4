"""What an episode's requests cost the farm, route by route (issue 24): CPU per request of the
``--no-ray`` farm's front, its env workers and its verifier sandbox, for lease + release, the
tool listing, a tool call and a verify, each driven alone at 32 in flight.

An episode of the rollout benchmark is a lease, the tool listing, ~3 tool calls, a verify and a
release; this says which of them the farm's CPU per episode goes to.

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/farm/bench_episode_cost.py'
Raw results: benchmarks/results/episode_cost.json.

``--baseline REV`` measures the verify route only, this tree's farm and REV's (its ``envfarm``
and ``judge`` exported with ``git archive``) taking turns, one farm process per round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
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


async def verify_round(url: str, pid: int, env: str, task: int, calls: list, n: int) -> dict:
    """The verify route alone (after each lease made the episode's changes)."""
    async with Farm(url, transport=AiohttpTransport(url, max_connections=4 * IN_FLIGHT)) as farm:
        held = [await farm.acquire(env, task_idx=task) for _ in range(IN_FLIGHT)]
        try:
            for lease in held:
                for call in calls:
                    await lease.call_result(call.tool, call.arguments)
            for lease in held:  # warm: the verifier sandbox starts on the first verify
                await lease.verify(task, "The task is done.")
            return await measure(
                pid, n, lambda i: held[i % IN_FLIGHT].verify(task, "The task is done."))
        finally:
            for lease in held:
                await lease.release()


def side_by_side(args: argparse.Namespace, env: str, task: int, calls: list) -> dict:
    """The verify route, this tree against ``args.baseline``, rounds taking turns."""
    folder = Path(tempfile.mkdtemp(prefix="envfarm-baseline-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline, "envfarm",
                              "judge"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    roots = {"this_tree": REPO, "baseline": folder}
    rounds: dict[str, list[dict]] = {k: [] for k in roots}
    try:
        for r in range(args.rounds):
            for name in (list(roots) if r % 2 == 0 else list(roots)[::-1]):
                proc, url = start_no_ray(warm=2 * IN_FLIGHT, verifier_workers=2, root=roots[name])
                try:
                    out = asyncio.run(verify_round(url, proc.pid, env, task, calls, args.n))
                finally:
                    proc.terminate()
                    proc.wait(timeout=15)
                rounds[name].append({**out, "load_avg_1m": round(os.getloadavg()[0], 2)})
                print(name, json.dumps(rounds[name][-1]), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    median = {name: {k: sorted(r.get(k, 0.0) for r in rs)[len(rs) // 2]
                     for k in sorted({k for r in rs for k in r})}
              for name, rs in rounds.items()}
    return {"baseline": args.baseline, "route": "verify", "median": median, "rounds": rounds,
            "ratio_all": round(median["this_tree"]["all"] / median["baseline"]["all"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="hotel_booking_1")
    ap.add_argument("--n", type=int, default=800, help="requests per route and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=OUT)
    ap.add_argument("--baseline", default=None,
                    help="a commit: measure the verify route only, side by side with it")
    args = ap.parse_args()
    catalog = load_catalog()
    bundle = catalog[args.env]
    task = min(i for i in bundle.solutions if i in bundle.code_verifiers)
    if args.baseline:
        res = side_by_side(args, args.env, task, bundle.solutions[task])
        res["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
        print(json.dumps(res["median"], indent=1), "ratio", res["ratio_all"])
        return
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
