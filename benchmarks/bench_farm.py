"""The farm, side by side in one run: --no-ray ceiling, Serve HTTP, batched path, MCP, in-cluster
handles, 1,024 held leases, AWM's process-per-instance baseline, and locust.

Starts Ray: run it inside a private network namespace, e.g.
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/bench_farm.py'
"""

from __future__ import annotations

import argparse
import asyncio
import csv
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

from bench_farm_load import (
    ENV,
    TOOL,
    _drive,
    batched_calls,
    http_calls,
    lease_batch_latency,
    lease_latency,
    mcp_calls,
    pct,
    release,
    session,
    summary,
    tree_memory,
)

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def free_port() -> int:
    from envfarm.farm import free_port as fp

    return fp()


def wait_http(url: str, timeout_s: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


# -- --no-ray: the farm in one uvicorn process (a subprocess, so the client has its own GIL) --
def start_no_ray(warm: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    code = ("from envfarm.farm import FarmConfig, FarmCore, PoolConfig, make_server\n"
            f"core = FarmCore(FarmConfig(envs=[{ENV!r}], pool=PoolConfig(warm={warm})))\n"
            f"make_server(core, '127.0.0.1', {port}).run()\n")
    proc = subprocess.Popen([PY, "-c", code], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz")
    return proc, url


async def hold_leases(url: str, n: int, duration_s: float, mem: Any) -> dict:
    """Hold n leases; batched calls flow over all of them; memory sampled mid-flow."""
    async with session() as s:
        t0 = time.perf_counter()
        leases: list[dict] = []
        while len(leases) < n:  # leases:batch, 64 at a time
            async with s.post(f"{url}/envs/{ENV}/leases:batch",
                              json={"count": min(64, n - len(leases))}) as r:
                leases += await r.json()
        acquire_s = time.perf_counter() - t0
        batch = 64
        by_owner: dict[str, list[dict]] = {}
        for le in leases:
            by_owner.setdefault(le["lease_id"].rpartition("-")[0], []).append(le)
        groups = [g[i:i + batch] for g in by_owner.values() for i in range(0, len(g), batch)]

        async def one(i: int) -> int:
            owner = groups[i][0]["lease_id"].rpartition("-")[0]
            body = {"calls": [{"env": ENV, "lease_id": le["lease_id"], "token": le["token"],
                               "tool": TOOL, "arguments": {}} for le in groups[i]]}
            async with s.post(f"{url}/envs/{ENV}/owners/{owner}/batch", json=body) as r:
                data = await r.json()
            return sum(1 for x in data["results"] if x.get("result") and x["result"]["ok"])

        sampled: dict = {}

        async def sample() -> None:
            await asyncio.sleep(duration_s / 2)
            sampled.update(mem())

        sampler = asyncio.create_task(sample())
        lat, calls, elapsed = await _drive(len(groups), duration_s, one)
        await sampler
        for lease in leases:
            await release(s, url, lease)
    return {"leases": n, "owners": len(by_owner), "acquire_all_s": round(acquire_s, 2),
            "flow": summary(lat, calls, elapsed, batch=batch), "memory": sampled}


# -- AWM's approach: one uvicorn process + one SQLite file per instance ----------------------
def start_awm(n: int) -> tuple[Any, list[subprocess.Popen], list[str], Path, float]:
    """n uvicorn processes of the env's own code, each with its own SQLite file."""
    from envfarm import EnvRuntime, load_catalog

    runtime = EnvRuntime(load_catalog()[ENV])
    tmp = Path(tempfile.mkdtemp(prefix="awm-baseline-"))
    (tmp / "awm_env.py").write_text(runtime.bundle.code or "")
    procs, urls = [], []
    t0 = time.perf_counter()
    for i in range(n):
        db = tmp / f"inst{i}.db"
        db.write_bytes(runtime.template.data)
        port = free_port()
        env = {**os.environ, "DATABASE_PATH": f"sqlite:///{db}"}
        procs.append(subprocess.Popen(
            [PY, "-m", "uvicorn", "awm_env:app", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "warning", "--no-access-log"], cwd=tmp, env=env))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_http(url + "/openapi.json", 120)
    return runtime, procs, urls, tmp, time.perf_counter() - t0


def awm_baseline(n: int, duration_s: float, workers: int) -> dict:
    import psutil

    runtime, procs, urls, tmp, start_s = start_awm(n)
    op = runtime.operations[TOOL]
    try:
        rss = pss = 0
        for p in procs:
            info = psutil.Process(p.pid).memory_full_info()
            rss, pss = rss + info.rss, pss + info.pss
        memory = {"processes": n, "rss_mib": round(rss / 2**20, 1),
                  "pss_mib": round(pss / 2**20, 1)}

        async def drive() -> tuple[list[float], int, float]:
            async with session() as s:
                async def one(i: int) -> int:
                    async with s.request(op.method, urls[i % n] + op.path) as r:
                        await r.read()
                        if r.status >= 400:
                            raise RuntimeError(f"AWM call failed: {r.status}")
                    return 1

                return await _drive(workers, duration_s, one)

        lat, calls, elapsed = asyncio.run(drive())
        # A reset, AWM's way: copy the DB file back (the process keeps running).
        t1 = time.perf_counter()
        for i in range(n):
            shutil.copyfile(tmp / "inst0.db", tmp / f"reset{i}.db")
        reset_ms = (time.perf_counter() - t1) / n * 1000
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    per = memory["pss_mib"] / n
    return {"instances": n, "start_all_s": round(start_s, 1), "memory": memory,
            "pss_per_instance_mib": round(per, 1),
            "extrapolated_1024_gib": round(per * 1024 / 1024, 1),
            "calls": summary(lat, calls, elapsed, workers=workers),
            "reset_file_copy_ms": round(reset_ms, 3)}


# -- locust, headless and bounded -----------------------------------------------------------
def run_locust(url: str, users: int, seconds: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="locust-"))
    cmd = [PY, "-m", "locust", "-f", str(REPO / "benchmarks" / "locustfile.py"), "--headless",
           "-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--host", url,
           "--csv", str(out / "run"), "--only-summary", "--loglevel", "WARNING"]
    subprocess.run(cmd, cwd=REPO, check=False, capture_output=True, text=True,
                   timeout=seconds + 60)
    rows = {r["Name"]: r for r in csv.DictReader((out / "run_stats.csv").open())}
    shutil.rmtree(out, ignore_errors=True)

    def pick(name: str) -> dict:
        r = rows.get(name, {})
        return {"requests": int(r.get("Request Count", 0) or 0),
                "failures": int(r.get("Failure Count", 0) or 0),
                "req_per_s": round(float(r.get("Requests/s", 0) or 0), 1),
                "p50_ms": float(r.get("50%", 0) or 0), "p99_ms": float(r.get("99%", 0) or 0)}

    return {"users": users, "seconds": seconds, "call": pick("call"), "lease": pick("lease"),
            "all": pick("Aggregated")}


# -- main -----------------------------------------------------------------------------------
MODES = {
    "http_calls": lambda url, d: http_calls(url, 32, d),
    "batched_calls": lambda url, d: batched_calls(url, 4, 64, d, via="owner"),
    "batched_front": lambda url, d: batched_calls(url, 4, 64, d, via="front"),
    "mcp_calls": lambda url, d: mcp_calls(url, 32, d),
}


def median_run(runs: list[dict]) -> dict:
    """The run with the median throughput, plus every run's throughput."""
    ordered = sorted(runs, key=lambda r: r["calls_per_s"])
    return {**ordered[len(ordered) // 2], "runs_calls_per_s": [r["calls_per_s"] for r in runs]}


def interleaved(urls: dict[str, str], duration: float, rounds: int) -> dict[str, dict]:
    """Every mode, alternating sides round by round: the machine is shared, and its load drifts
    over minutes, so back-to-back blocks would compare different machines."""
    out: dict[str, dict] = {side: {} for side in urls}
    for name, fn in MODES.items():
        runs: dict[str, list[dict]] = {side: [] for side in urls}
        for _ in range(rounds):
            for side, url in urls.items():
                runs[side].append(asyncio.run(fn(url, duration)))
        for side in urls:
            out[side][name] = median_run(runs[side])
    for side, url in urls.items():
        out[side]["lease_acquire"] = asyncio.run(lease_latency(url, 300))
        out[side]["lease_acquire_batch16"] = asyncio.run(lease_batch_latency(url, 16, 40))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per throughput run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per mode and side")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--awm", type=int, default=16, help="AWM baseline instances")
    ap.add_argument("--hold", type=int, default=1024, help="leases held at once")
    ap.add_argument("--locust-seconds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    d, rounds = (1.5, 1) if args.quick else (args.duration, args.rounds)
    res: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                       "loadavg_start": os.getloadavg()},
                           "settings": {"duration_s": d, "rounds": rounds,
                                        "replicas": args.replicas, "tool": TOOL, "env": ENV}}
    from envfarm.farm import FarmConfig, PoolConfig
    from envfarm.serve import DeploymentOptions, ServeOptions, start_farm

    proc, local_url = start_no_ray(warm=64)
    t0 = time.perf_counter()
    farm = start_farm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=64)),
                      ServeOptions(port=free_port(), num_cpus=2,
                                   deployment=DeploymentOptions(num_replicas=args.replicas)))
    res["serve_startup_s"] = round(time.perf_counter() - t0, 1)
    not_ray = {proc.pid}
    try:
        both = interleaved({"no_ray": local_url, "serve": farm.url}, d, rounds)
        res["no_ray"], res["serve"] = both["no_ray"], both["serve"]
        res["serve"]["handles"] = asyncio.run(handle_calls(d * rounds))
        res["no_ray"]["hold"] = asyncio.run(hold_leases(
            local_url, args.hold, d, lambda: tree_memory(proc.pid, exclude_self=False)))
        res["serve"]["hold"] = asyncio.run(hold_leases(
            farm.url, args.hold, d, lambda: tree_memory(exclude=not_ray)))
        res["serve"]["memory_after_release"] = tree_memory(exclude=not_ray)
        secs = 5 if args.quick else args.locust_seconds
        res["no_ray"]["locust"] = run_locust(local_url, 20, secs)
        res["serve"]["locust"] = run_locust(farm.url, 20, secs)
    finally:
        farm.shutdown()
        proc.terminate()
        proc.wait(timeout=15)

    res["awm"] = awm_baseline(4 if args.quick else args.awm, d * rounds, 32)
    res["machine"]["loadavg_end"] = os.getloadavg()
    # The single-process ceiling: the best the --no-ray process did, per call or batched.
    ceiling = max(res["no_ray"][k]["calls_per_s"]
                  for k in ("http_calls", "batched_calls", "batched_front"))
    res["ceiling_calls_per_s"] = ceiling
    res["ratios"] = {f"serve_{k}_vs_ceiling": round(res["serve"][k]["calls_per_s"] / ceiling, 2)
                     for k in ("http_calls", "batched_calls", "batched_front", "mcp_calls",
                               "handles")}
    text = json.dumps(res, indent=2)
    print(text)
    print(render_markdown(res))
    if args.json:
        args.json.write_text(text)


def render_markdown(res: dict) -> str:
    """The tables of RESULTS.md's Farm section, from one run's JSON."""
    nr, sv, awm = res["no_ray"], res["serve"], res["awm"]

    def row(name: str, r: dict, unit: str = "") -> str:
        return (f"| {name} | {r['calls_per_s']:,.0f} | {r['p50_ms']:g} | {r['p99_ms']:g} |"
                f" {unit} |")

    lines = [
        "| path (same run, interleaved) | calls/s | p50 ms | p99 ms | notes |",
        "|---|---|---|---|---|",
        row("--no-ray, HTTP, 32 leases", nr["http_calls"], "one call per request"),
        row("--no-ray, owner batch x64", nr["batched_calls"], "latency per batch"),
        row("--no-ray, MCP tools/call, 32 leases", nr["mcp_calls"], ""),
        row("Serve HTTP, 32 leases", sv["http_calls"], "one call per request"),
        row("Serve owner batch x64 (`/envs/{env}/owners/{o}/batch`)", sv["batched_calls"],
            "one hop; latency per batch"),
        row("Serve front batch x64 (`/batch/call`)", sv["batched_front"],
            "front fans out by handle"),
        row("Serve MCP tools/call, 32 leases", sv["mcp_calls"], ""),
        row("in-cluster DeploymentHandles, batch x64", sv["handles"], "no HTTP proxy"),
        row(f"AWM: {awm['instances']} uvicorn processes + DB files", awm["calls"],
            "one call per request"),
    ]
    la, lb, lh = nr["lease_acquire"], sv["lease_acquire"], sv["handles"]["lease_acquire"]
    lines += [
        "",
        "| lease acquire (warm pool) | p50 ms | p99 ms |",
        "|---|---|---|",
        f"| --no-ray HTTP | {la['p50_ms']} | {la['p99_ms']} |",
        f"| Serve HTTP | {lb['p50_ms']} | {lb['p99_ms']} |",
        (f"| Serve HTTP `leases:batch` x16, per lease | "
        f"{sv['lease_acquire_batch16']['per_lease_p50_ms']} | - |"),
        f"| in-cluster handle | {lh['p50_ms']} | {lh['p99_ms']} |",
        "",
        ("| 1,024 leases held, calls flowing | total RSS MiB | total PSS MiB | processes |"
        " calls/s |"),
        "|---|---|---|---|---|",
    ]
    for name, h in (("--no-ray (one process)", nr["hold"]),
                    ("Serve (all Ray processes)", sv["hold"])):
        m = h["memory"]
        lines.append(f"| {name} | {m['rss_mib']:,.0f} | {m['pss_mib']:,.0f} | "
                     f"{m['processes']} | {h['flow']['calls_per_s']:,.0f} |")
    am = awm["memory"]
    lines.append(f"| AWM, {awm['instances']} instances (measured) | {am['rss_mib']:,.0f} | "
                 f"{am['pss_mib']:,.0f} | {am['processes']} | "
                 f"{awm['calls']['calls_per_s']:,.0f} |")
    lines.append(f"| AWM, 1,024 instances (extrapolated) | - | "
                 f"{awm['extrapolated_1024_gib'] * 1024:,.0f} | 1,024 | - |")
    lines += ["", ("| locust, 20 users, lease -> 20 calls -> release | req/s | p50 ms | p99 ms |"
              " failures |"), "|---|---|---|---|---|"]
    for name, lo in (("--no-ray", nr["locust"]), ("Serve", sv["locust"])):
        a = lo["all"]
        lines.append(f"| {name} | {a['req_per_s']} | {a['p50_ms']:g} | {a['p99_ms']:g} |"
                     f" {a['failures']} |")
    return "\n".join(lines)


async def handle_calls(duration_s: float, workers: int = 4, batch: int = 64) -> dict:
    """The in-cluster path: DeploymentHandles from this (driver) process, no HTTP proxy."""
    from envfarm.serve import InClusterFarm

    farm = await InClusterFarm.connect()
    lat = []
    for _ in range(120):
        t0 = time.perf_counter()
        lease = await farm.lease(ENV)
        lat.append(time.perf_counter() - t0)
        await farm.release(lease)
    acquire = {"n": len(lat[20:]), "p50_ms": round(pct(lat[20:], 0.5) * 1000, 2),
               "p99_ms": round(pct(lat[20:], 0.99) * 1000, 2)}
    groups = [[await farm.lease(ENV) for _ in range(batch)] for _ in range(workers)]

    async def one(i: int) -> int:
        out = await farm.call_many([(lease, TOOL, {}) for lease in groups[i]])
        return sum(1 for r in out if r.result is not None and r.result.ok)

    lat, calls, elapsed = await _drive(workers, duration_s, one)
    for g in groups:
        for lease in g:
            await farm.release(lease)
    return summary(lat, calls, elapsed, workers=workers, batch=batch,
                   note="latency is per batch of calls", lease_acquire=acquire)


if __name__ == "__main__":
    main()
