"""The SDK's client CPU per tool call, httpx against aiohttp (issue 24, item 4).

The same SDK calls (``Lease.call``: request, JSON, ``CallResult`` parse) through each transport
against a farm-shaped server that does no work (``tests/fakes/echo_farm.py``, its own process),
so the figure is the client's: CPU seconds of this process over the calls, per call. Rounds
interleave the transports; concurrency is how many calls are in flight at once (one lease
each, as a trainer's episodes are).

    .venv/bin/python benchmarks/farm/bench_sdk_transport.py [--calls 4096] [--rounds 3]

Raw results: benchmarks/results/sdk_transport.json.
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

from envfarm.client import AiohttpTransport, Farm, HttpxTransport  # noqa: E402
from tests.fakes.echo_farm import EchoFarm  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "sdk_transport.json"
TRANSPORTS = {"httpx": HttpxTransport, "aiohttp": AiohttpTransport}


async def run(url: str, transport: str, concurrency: int, calls: int) -> dict[str, Any]:
    """``calls`` tool calls, ``concurrency`` in flight; client CPU and wall per call."""
    async with Farm(url, transport=TRANSPORTS[transport](url, max_connections=1024)) as farm:
        leases = [await farm.acquire("echo") for _ in range(concurrency)]
        for lease in leases:  # open the connections first: the figure is the steady state
            await lease.call("echo", {"i": 0})
        per_lease = max(1, calls // concurrency)

        async def episode(lease, k: int) -> None:
            for i in range(per_lease):
                got = await lease.call("echo", {"i": i, "k": k})
                assert got["arguments"] == {"i": i, "k": k}, got

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(episode(lease, k) for k, lease in enumerate(leases)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    n = per_lease * concurrency
    return {"calls": n, "cpu_us_per_call": round(cpu / n * 1e6, 1),
            "wall_s": round(wall, 3), "calls_per_s": round(n / wall)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=4096, help="tool calls per figure")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,64,1024,4096")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_start": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": []}
    with EchoFarm() as echo:
        for i in range(args.rounds):
            row = {f"{t}/{c}": asyncio.run(run(echo.url, t, c, max(args.calls, c)))
                   for c in levels for t in TRANSPORTS}
            result["rounds"].append(row)
            print(f"round {i + 1}:", json.dumps({k: v["cpu_us_per_call"] for k, v in row.items()}),
                  flush=True)
    result["machine"]["load_avg_end"] = os.getloadavg()
    summary: dict[str, Any] = {}
    for key in result["rounds"][0]:
        rows = [r[key] for r in result["rounds"]]
        summary[key] = {m: statistics.median(r[m] for r in rows)
                        for m in ("cpu_us_per_call", "calls_per_s", "wall_s")}
    for c in levels:
        summary[f"httpx_vs_aiohttp/{c}"] = round(statistics.median(
            r[f"httpx/{c}"]["cpu_us_per_call"] / r[f"aiohttp/{c}"]["cpu_us_per_call"]
            for r in result["rounds"]), 2)
    result["summary"] = summary
    print(json.dumps(summary, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
