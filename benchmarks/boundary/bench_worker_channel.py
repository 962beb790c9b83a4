"""Where a call's CPU goes across the worker boundary, without HTTP (issue 24).

One env worker, 32 instances in it, driven straight through ``WorkerEnv`` (the front's side of
the channel) at 1, 4 and 32 calls in flight; per call: this process's CPU (the front's share
of the channel), the worker's user and system CPU (``/proc/PID/stat``), and, at one in flight,
the round trip's p50. Beside it, the same tool's ``Instance.call`` in this process (what the
worker runs for each call). Jailed and unjailed workers alternate, rounds interleaved.

    python benchmarks/boundary/bench_worker_channel.py [--rounds 3] [--calls 3000] [--pin]

``--pin`` adds jailed rounds with this process (the front's side) on CPU 0 and the worker on
CPU 1: is the worker's extra CPU per call at low batching the two processes evicting each
other's caches on a shared core?
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil

from benchmarks.runtime.bench_fence import cpu_per_call
from envfarm import EnvRuntime, load_catalog
from envfarm.worker._env import WorkerEnv, WorkerOptions

ENV, TOOL, INSTANCES = "hotel_booking_1", "get_my_profile", 32


def _proc_cpu(pid: int) -> tuple[float, float]:
    times = psutil.Process(pid).cpu_times()
    return times.user, times.system


async def _through_worker(bundle, jail: bool, in_flight: int, calls: int,
                          pin: bool = False) -> dict:
    env = WorkerEnv(bundle, WorkerOptions(probe_module_state=False, jail=jail), warm=1)
    every_cpu = os.sched_getaffinity(0)
    try:
        insts = [await env.acquire() for _ in range(INSTANCES)]
        pid = env.workers[0].pid
        if pin:
            os.sched_setaffinity(0, {0})
            os.sched_setaffinity(pid, {1})
        lat: list[float] = []

        async def client(inst, n: int) -> None:
            for _ in range(n):
                t = time.perf_counter()
                res = await inst.call(TOOL, {})
                lat.append(time.perf_counter() - t)
                assert res.ok, res.error

        await asyncio.gather(*(client(insts[i], 20) for i in range(in_flight)))
        lat.clear()
        per = calls // in_flight
        (u0, s0), c0 = _proc_cpu(pid), time.process_time()
        await asyncio.gather(*(client(insts[i % INSTANCES], per) for i in range(in_flight)))
        (u1, s1), c1 = _proc_cpu(pid), time.process_time()
        n = per * in_flight
        return {"front_us": (c1 - c0) / n * 1e6, "worker_user_us": (u1 - u0) / n * 1e6,
                "worker_sys_us": (s1 - s0) / n * 1e6, "p50_ms": statistics.median(lat) * 1e3}
    finally:
        os.sched_setaffinity(0, every_cpu)
        await env.aclose()


async def _in_process(bundle, calls: int) -> float:
    runtime = EnvRuntime(bundle)
    insts = [runtime.instance() for _ in range(INSTANCES)]
    await cpu_per_call(insts, TOOL, {}, 100)  # warm the statement caches
    return await cpu_per_call(insts, TOOL, {}, calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--pin", action="store_true", help="also jailed rounds on pinned CPUs")
    ap.add_argument("--out", type=Path, default=None)
    opts = ap.parse_args()
    bundle = load_catalog()[ENV]
    runs: dict[str, list] = {}
    load0 = os.getloadavg()[0]
    for _ in range(opts.rounds):
        runs.setdefault("in_process_us", []).append(asyncio.run(_in_process(bundle, opts.calls)))
        for jail in (True, False):
            for in_flight in (1, 4, 32):
                key = f"{'jailed' if jail else 'unjailed'}/{in_flight}"
                runs.setdefault(key, []).append(
                    asyncio.run(_through_worker(bundle, jail, in_flight, opts.calls)))
                if jail and opts.pin and os.cpu_count() >= 2:
                    runs.setdefault(key + "/pinned", []).append(
                        asyncio.run(_through_worker(bundle, jail, in_flight, opts.calls, True)))
    summary = {"in_process_us": round(statistics.median(runs["in_process_us"]))}
    for key, rows in runs.items():
        if key != "in_process_us":
            summary[key] = {f: round(statistics.median(r[f] for r in rows), 3 if f == "p50_ms"
                                     else 0) for f in rows[0]}
    report = {"env": ENV, "tool": TOOL, "machine": f"{platform.node()} {os.cpu_count()} cpus",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "load": [load0, os.getloadavg()[0]], "summary": summary, "runs": runs}
    print(json.dumps(summary, indent=1))
    if opts.out:
        opts.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
