"""What the status page's rolling window costs on the call path: one ``CallWindow.record_call``
alone, and ``FarmCore.call`` with the window recording vs a no-op window, rounds alternated in
one process (medians), so the ratio holds on a loaded machine.

    python benchmarks/farm/bench_status_window.py --json benchmarks/results/status_window.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
import timeit
from pathlib import Path

from envfarm.farm import FarmConfig, FarmCore, LeaseRequest, PoolConfig
from envfarm.farm._window import CallWindow

ENV, TOOL = "hotel_booking_1", "list_wishlists"


class NoWindow:
    """The window switched off: what the call path cost before it existed."""

    def record_call(self, env: str, outcome: str, seconds: float) -> None:
        return None


async def per_call_us(core: FarmCore, calls: int) -> float:
    lease = core.lease(ENV, (info := await core.create_lease(ENV, LeaseRequest())).lease_id,
                       info.token)
    started = time.perf_counter()
    for _ in range(calls):
        await core.call(lease, TOOL, {})
    elapsed = time.perf_counter() - started
    core.release(ENV, info.lease_id, info.token)
    return elapsed / calls * 1e6


async def side_by_side(rounds: int, calls: int) -> dict[str, list[float]]:
    core = FarmCore(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2), isolation="in_process"))
    window = core.window
    await per_call_us(core, 200)  # warm up
    runs: dict[str, list[float]] = {"window": [], "no_window": []}
    for i in range(rounds):
        order = ["window", "no_window"] if i % 2 == 0 else ["no_window", "window"]
        for side in order:
            core.window = window if side == "window" else NoWindow()  # type: ignore[assignment]
            runs[side].append(await per_call_us(core, calls))
    await core.aclose()
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=1000, help="calls per round and side")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    window = CallWindow()
    record_ns = statistics.median(timeit.repeat(
        lambda: window.record_call(ENV, "ok", 0.0021), number=100_000, repeat=7)) / 100_000 * 1e9
    runs = asyncio.run(side_by_side(args.rounds, args.calls))
    with_w, without = statistics.median(runs["window"]), statistics.median(runs["no_window"])
    out = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   "shared and loaded (other jobs running)",
        "date": time.strftime("%Y-%m-%d"),
        "record_call_ns": round(record_ns, 1),
        "core_call_us": {"window": round(with_w, 1), "no_window": round(without, 1)},
        "ratio_window_over_none": round(with_w / without, 3),
        "best_round_us": {k: round(min(vs), 1) for k, vs in runs.items()},
        "record_share_of_a_call": round(record_ns / 1000 / without, 5),
        "rounds_us": {k: [round(v, 1) for v in vs] for k, vs in runs.items()},
        "calls_per_round": args.calls,
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
