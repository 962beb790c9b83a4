"""What the env-code guard costs: one tool call and one reset, and the host-side price of the
process-wide patches (run it against two checkouts to compare; medians of repeats).

    python benchmarks/runtime/bench_guard.py            # prints one JSON object
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envfarm import EnvRuntime  # noqa: E402
from tests.fakes.toy_env import toy_bundle  # noqa: E402

REPEATS, CALLS, RESETS = 7, 300, 3000


def _median_us(fn, number: int) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=REPEATS)) / number * 1e6


def main() -> None:
    rt = EnvRuntime(toy_bundle(), call_timeout_s=10)
    inst = rt.instance()
    out: dict[str, float] = {}

    async def calls(tool: str, args: dict) -> float:
        runs = []
        for _ in range(REPEATS):
            t = time.perf_counter()
            for _ in range(CALLS):
                await inst.call(tool, args)
            runs.append((time.perf_counter() - t) / CALLS * 1e6)
        return statistics.median(runs)

    async def run_calls() -> None:
        for _ in range(50):  # warm up caches
            await inst.call("list_notes", {})
        out["call_list_notes_us"] = await calls("list_notes", {})
        out["call_get_note_us"] = await calls("get_note", {"note_id": 1})
        out["call_sync_handler_us"] = await calls("create_note_sync", {"title": "x"})

    asyncio.run(run_calls())
    out["reset_us"] = _median_us(inst.reset, RESETS)
    # Host code under the installed guard (a call above installed it, where this version has it).
    os.environ["BENCH_GUARD"] = "1"
    out["host_environ_get_us"] = _median_us(lambda: os.environ.get("BENCH_GUARD"), 100_000)
    out["host_sleep0_us"] = _median_us(lambda: time.sleep(0), 100_000)
    r, w = os.pipe()
    out["host_os_write_read_us"] = _median_us(lambda: (os.write(w, b"x"), os.read(r, 1)), 100_000)
    print(json.dumps({k: round(v, 2) for k, v in out.items()}))


if __name__ == "__main__":
    main()
