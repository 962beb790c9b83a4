"""What the runtime's fence costs per tool call, with and without its lift (issue 24).

The fence is each instance connection's SQLite progress handler (``_sqlite_guard.Fence``); a
call alone in the process runs its steps with it lifted. This times ``Instance.call`` in one
process, the lift on and off in alternating runs over the same instances, as CPU per call
(``time.process_time``), and prints medians and their ratio as JSON.

    python benchmarks/runtime/bench_fence.py [--env hotel_booking_1] [--runs 7] [--calls 400]
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

from envfarm import EnvRuntime, _sqlite_guard, load_catalog

CALLS = {
    "hotel_booking_1": [("get_my_profile", {}), ("search_hotels", {"city": "Lisbon"})],
}


async def cpu_per_call(instances, tool: str, args: dict, calls: int) -> float:
    """CPU µs per ``Instance.call``, the calls spread over ``instances`` in turn."""
    start = time.process_time()
    for i in range(calls):
        res = await instances[i % len(instances)].call(tool, args)
        assert res.ok, res.error
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="hotel_booking_1")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--out", type=Path, default=None)
    opts = ap.parse_args()
    rt = EnvRuntime(load_catalog()[opts.env])
    instances = [rt.instance() for _ in range(32)]
    calls = _sqlite_guard._calls
    report: dict = {"env": opts.env, "runs": opts.runs, "calls": opts.calls,
                    "machine": f"{platform.node()} {os.cpu_count()} cpus",
                    "load": os.getloadavg()[0], "tools": {}}
    for tool, args in CALLS.get(opts.env, [(next(iter(rt.operations)), {})]):
        asyncio.run(cpu_per_call(instances, tool, args, 50))  # warm the statement caches
        runs: dict[str, list[float]] = {"lifted": [], "fenced": []}
        for _ in range(opts.runs):
            for mode in ("lifted", "fenced"):
                calls.lift_enabled = mode == "lifted"
                lifts = calls.lifts
                runs[mode].append(asyncio.run(cpu_per_call(instances, tool, args, opts.calls)))
                assert (calls.lifts > lifts) == (mode == "lifted")
        calls.lift_enabled = True
        med = {m: statistics.median(v) for m, v in runs.items()}
        report["tools"][tool] = {"cpu_us_per_call_median": med, "runs": runs,
                                 "fenced_over_lifted": med["fenced"] / med["lifted"]}
    report["load_after"] = os.getloadavg()[0]
    text = json.dumps(report, indent=1)
    print(text)
    if opts.out:
        opts.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
