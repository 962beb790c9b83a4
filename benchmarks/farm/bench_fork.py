"""What a fork costs, beside what the issue bounds it by: a reset plus a copy of the database.

Per isolation (in-process, confined workers) and env, on one lease with a few writes made:
``FarmCore.fork`` (snapshot under the parent's lock, a fresh instance, restore; the child then
released), ``FarmCore.reset``, ``FarmCore.snapshot`` (the copy of the database out of the
instance: what a fork must move at least) and ``FarmCore.create_lease`` (a new lease's own
bookkeeping, which a fork has too). Interleaved rounds, medians.

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/farm/bench_fork.py'

Prints a table and writes benchmarks/results/fork.json (``--quick``: a short run, no file).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path

from envfarm import load_catalog
from envfarm.compose import compose_core
from envfarm.farm import FarmConfig, ForkRequest, LeaseRequest, PoolConfig

ROOT = Path(__file__).resolve().parents[1]
AWM = ROOT.parent / "shared" / "awm1k_samples"
#: (catalog, env, task, writes made on the parent before forking)
CASES = [
    (None, "hotel_booking_1", 4, [("create_wishlist", {"name": "bench"})]),
    (AWM, "content_platform_1", 0, []),
]


async def measure(catalog_path: Path | None, env: str, task: int, writes: list, isolation: str,
                  rounds: int) -> dict:
    catalog = load_catalog(catalog_path)
    config = FarmConfig(envs=[env], pool=PoolConfig(warm=4), isolation=isolation,
                        check_module_state=False)
    core = compose_core(config, catalog=catalog)
    await core.start()
    try:
        info = await core.create_lease(env, LeaseRequest(task_idx=task))
        parent = core.leases[info.lease_id]
        for tool, args in writes:
            await core.call(parent, tool, args)
        times: dict[str, list[float]] = {"fork": [], "reset": [], "snapshot": [], "create": []}
        size = len(await core.snapshot(parent))
        for _ in range(rounds):
            t = time.perf_counter()
            child = await core.fork(parent, ForkRequest())
            times["fork"].append(time.perf_counter() - t)
            core.release(env, child.lease_id, child.token)
            t = time.perf_counter()
            await core.snapshot(parent)
            times["snapshot"].append(time.perf_counter() - t)
            scratch = await core.fork(parent, ForkRequest())  # reset a copy, keep the parent
            lease = core.leases[scratch.lease_id]
            t = time.perf_counter()
            await core.reset(lease)
            times["reset"].append(time.perf_counter() - t)
            core.release(env, scratch.lease_id, scratch.token)
            await asyncio.sleep(0)  # let released instances recycle
            t = time.perf_counter()
            fresh = await core.create_lease(env, LeaseRequest(task_idx=task))
            times["create"].append(time.perf_counter() - t)
            core.release(env, fresh.lease_id, fresh.token)
            await asyncio.sleep(0)
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        bound = med["reset"] + med["snapshot"]
        return {"env": env, "isolation": isolation, "db_bytes": size, "rounds": rounds,
                **{f"{k}_us": round(v, 1) for k, v in med.items()},
                "fork_over_reset_plus_copy": round(med["fork"] / bound, 2),
                "fork_over_create_plus_copy": round(med["fork"] / (med["create"]
                                                                   + med["snapshot"]), 2)}
    finally:
        await core.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "fork.json"))
    args = parser.parse_args()
    rounds = 20 if args.quick else 200
    rows = []
    for catalog, env, task, writes in CASES:
        if catalog is not None and not (catalog / "gen_envs.jsonl").is_file():
            continue
        for isolation in ("in_process", "workers"):
            rows.append(await measure(catalog, env, task, writes, isolation, rounds))
    print("| env | isolation | DB bytes | fork µs | reset µs | copy (snapshot) µs | new lease µs "
          "| fork / (reset + copy) | fork / (new lease + copy) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['env']} | {r['isolation']} | {r['db_bytes']:,} | {r['fork_us']:.0f} | "
              f"{r['reset_us']:.0f} | {r['snapshot_us']:.0f} | {r['create_us']:.0f} | "
              f"{r['fork_over_reset_plus_copy']} | {r['fork_over_create_plus_copy']} |")
    if not args.quick:
        out = {"machine": platform.node(), "python": platform.python_version(),
               "cpus": os.cpu_count(), "load": os.getloadavg(), "time": time.time(),
               "rows": rows}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
