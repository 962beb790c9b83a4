"""Why envfarm calls env code through its own few lines of ASGI, not httpx's ASGI transport:
one tool call of the same endpoint four ways, alternating call by call in one process.

    .venv/bin/python benchmarks/runtime/bench_asgi_client.py      # raw: benchmarks/results/asgi_client.json

- ``httpx_client_per_call``: ``httpx.AsyncClient(transport=ASGITransport(app))`` built per call
  (what a call needs when each instance binds its own database);
- ``httpx_client_reused``: one such client for every call;
- ``bare_asgi``: one scope, receive and send, nothing else (bench_runtime.bare_asgi);
- ``envfarm_call``: ``Instance.call`` (argument check, snapshot, guard, binding, ASGI).

The first three run the env's code loaded AWM's way (module import, a SQLite file on tmpfs).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.runtime.bench_runtime import bare_asgi  # noqa: E402
from envfarm import EnvRuntime, load_catalog  # noqa: E402

ENV, TOOL = "hotel_booking_1", "get_my_profile"


async def measure(calls: int) -> dict:
    bundle = load_catalog()[ENV]
    rt = EnvRuntime(bundle)
    op = rt.operations[TOOL]
    work = Path(tempfile.mkdtemp(prefix="asgi_bench_", dir="/dev/shm"
                                 if os.access("/dev/shm", os.W_OK) else None))
    (work / "env.db").write_bytes(rt.template.data)
    (work / "bench_env.py").write_text(bundle.code)
    os.environ["DATABASE_PATH"] = f"sqlite:///{work / 'env.db'}"
    spec = importlib.util.spec_from_file_location("bench_env", work / "bench_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app, inst = module.app, rt.instance()
    reused = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://env")

    async def per_call() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://env") as client:
            assert (await client.request(op.method, op.path)).status_code == 200

    async def reuse() -> None:
        assert (await reused.request(op.method, op.path)).status_code == 200

    async def bare() -> None:
        assert (await bare_asgi(app, op.method, op.path, ""))[0] == 200

    async def ours() -> None:
        assert (await inst.call(TOOL, {})).ok

    ways = {"httpx_client_per_call": per_call, "httpx_client_reused": reuse,
            "bare_asgi": bare, "envfarm_call": ours}
    times: dict[str, list[float]] = {k: [] for k in ways}
    for fn in ways.values():  # warm up
        for _ in range(20):
            await fn()
    for i in range(calls):
        order = list(ways) if i % 2 == 0 else list(ways)[::-1]
        for name in order:
            t = time.perf_counter()
            await ways[name]()
            times[name].append(time.perf_counter() - t)
    await reused.aclose()
    shutil.rmtree(work)
    out = {name: {"p50_ms": round(statistics.median(t) * 1e3, 3),
                  "p99_ms": round(sorted(t)[int(0.99 * len(t))] * 1e3, 3)}
           for name, t in times.items()}
    return {"env": ENV, "tool": TOOL, "path": op.path, "calls_each": calls, "results": out,
            "per_call_client_minus_bare_ms": round(
                out["httpx_client_per_call"]["p50_ms"] - out["bare_asgi"]["p50_ms"], 3),
            "envfarm_minus_bare_us": round(
                (out["envfarm_call"]["p50_ms"] - out["bare_asgi"]["p50_ms"]) * 1e3, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls of each way")
    ap.add_argument("--quick", action="store_true", help="short smoke run, writes nothing")
    args = ap.parse_args()
    load = os.getloadavg()
    res = asyncio.run(measure(100 if args.quick else args.calls))
    res |= {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "loadavg_start": load,
            "loadavg_end": os.getloadavg(),
            "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}"}
    print(json.dumps(res, indent=2))
    if not args.quick:
        (ROOT / "benchmarks" / "results" / "asgi_client.json").write_text(
            json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
