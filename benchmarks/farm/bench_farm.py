"""The farm, side by side in one run: the --no-ray ceiling (one process, and as many processes as
Serve has pool replicas), Serve HTTP, batched paths, MCP, in-cluster handles, AWM's
process-per-instance baseline, Serve's floor (a trivial ingress), 1,024 held leases, and locust.

Every throughput mode of every side runs once per round, the order of the jobs reversed every
other round (the machine is shared and its load drifts); the tables show each mode's median
round. Sequential latencies (lease acquire, Serve's floor, /healthz) alternate the same way.
Locust and the 1,024-lease hold run once per side, after the rounds.

Starts Ray: run it inside a private network namespace, e.g.
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/farm/bench_farm.py \
        --json benchmarks/results/farm.json'
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks._procs import wait_http  # noqa: E402
from benchmarks.farm._farm_report import render_markdown  # noqa: E402
from benchmarks.load.bench_farm_load import (  # noqa: E402
    ENV,
    TOOL,
    _drive,
    batched_calls,
    handle_acquire,
    handle_calls,
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

PY = sys.executable


def free_port() -> int:
    from envfarm.farm import free_port as fp

    return fp()


# -- --no-ray: the farm in one uvicorn process (a subprocess, so the client has its own GIL) --
def start_no_ray(warm: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    code = ("from envfarm.compose import compose_core\n"
            "from envfarm.farm import FarmConfig, PoolConfig, make_server\n"
            f"core = compose_core(FarmConfig(envs=[{ENV!r}], pool=PoolConfig(warm={warm})))\n"
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


class AwmBaseline:
    """n uvicorn processes of the env's own code, each with its own SQLite file (AWM's way)."""

    def __init__(self, n: int) -> None:
        import psutil

        self.n = n
        self.runtime, self.procs, self.urls, self.tmp, self.start_s = start_awm(n)
        self.op = self.runtime.operations[TOOL]
        rss = pss = 0
        for p in self.procs:
            info = psutil.Process(p.pid).memory_full_info()
            rss, pss = rss + info.rss, pss + info.pss
        self.memory = {"processes": n, "rss_mib": round(rss / 2**20, 1),
                       "pss_mib": round(pss / 2**20, 1)}
        asyncio.run(self.warm_up())

    async def warm_up(self, per_process: int = 20) -> None:
        """The first calls of a fresh process pay for lazy imports and ORM set-up."""
        async with session() as s:
            for url in self.urls:
                for _ in range(per_process):
                    async with s.request(self.op.method, url + self.op.path) as r:
                        await r.read()

    async def calls(self, duration_s: float, workers: int = 32) -> dict:
        """One call per request, spread over the n processes."""
        async with session() as s:
            async def one(i: int) -> int:
                async with s.request(self.op.method, self.urls[i % self.n] + self.op.path) as r:
                    await r.read()
                    if r.status >= 400:
                        raise RuntimeError(f"AWM call failed: {r.status}")
                return 1

            lat, calls, elapsed = await _drive(workers, duration_s, one)
        return summary(lat, calls, elapsed, workers=workers)

    def stop(self) -> dict:
        # A reset, AWM's way: copy the DB file back (the process keeps running).
        t1 = time.perf_counter()
        for i in range(self.n):
            shutil.copyfile(self.tmp / "inst0.db", self.tmp / f"reset{i}.db")
        reset_ms = (time.perf_counter() - t1) / self.n * 1000
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)
        per = self.memory["pss_mib"] / self.n
        return {"instances": self.n, "start_all_s": round(self.start_s, 1),
                "memory": self.memory, "pss_per_instance_mib": round(per, 1),
                "extrapolated_1024_gib": round(per * 1024 / 1024, 1),
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


# -- Serve's floor: a trivial ingress in the same Serve instance ------------------------------
def deploy_floor(port: int) -> str:
    """A FastAPI ingress with one GET returning a constant, beside the farm's apps."""
    from fastapi import FastAPI
    from ray import serve

    app = FastAPI()

    @app.get("/")
    def constant() -> dict:
        return {"ok": True}

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    @serve.ingress(app)
    class Floor:
        pass

    serve.run(Floor.bind(), name="bench_floor", route_prefix="/bench-floor")
    return f"http://127.0.0.1:{port}/bench-floor/"


async def get_latency(url: str, n: int) -> dict:
    """Sequential GETs on one connection: p50/p99."""
    lat: list[float] = []
    async with session() as s:
        for k in range(n + 10):
            t0 = time.perf_counter()
            async with s.get(url) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status}")
            if k >= 10:
                lat.append(time.perf_counter() - t0)
    return {"n": n, "p50_ms": round(pct(lat, 0.5) * 1000, 2),
            "p99_ms": round(pct(lat, 0.99) * 1000, 2)}


# -- main -----------------------------------------------------------------------------------
# Per mode: the call for one farm process, given the share k of the client's concurrency.
MODES = {
    "http_calls": lambda url, d, k: http_calls(url, 32 // k, d),
    "batched_calls": lambda url, d, k: batched_calls(url, 4 // k, 64, d, via="owner"),
    "batched_front": lambda url, d, k: batched_calls(url, 4 // k, 64, d, via="front"),
    "mcp_calls": lambda url, d, k: mcp_calls(url, 32 // k, d),
}
CEILING_MODES = ("http_calls", "batched_calls", "batched_front")


async def on_all(mode: str, urls: list[str], duration: float) -> dict:
    """One mode on every process of a side at once (the client's concurrency split evenly)."""
    parts = await asyncio.gather(*(MODES[mode](u, duration, len(urls)) for u in urls))
    if len(parts) == 1:
        return parts[0]
    calls = sum(p["calls"] for p in parts)
    return {"calls": calls, "seconds": max(p["seconds"] for p in parts),
            "calls_per_s": round(sum(p["calls_per_s"] for p in parts), 1),
            "p50_ms": round(sum(p["p50_ms"] * p["calls"] for p in parts) / max(calls, 1), 2),
            "p99_ms": max(p["p99_ms"] for p in parts), "processes": len(parts),
            "note": "calls/s summed over the processes, p50 their calls-weighted mean, p99 "
                    "their max", "per_process": parts}


def median_run(runs: list[dict]) -> dict:
    """The run with the median throughput, plus every run's throughput."""
    ordered = sorted(runs, key=lambda r: r["calls_per_s"])
    return {**ordered[len(ordered) // 2], "runs_calls_per_s": [r["calls_per_s"] for r in runs]}


def interleaved(sides: dict[str, list[str]], awm: AwmBaseline, duration: float,
                rounds: int) -> dict[str, dict]:
    """Every (side, mode) job once per round, the job order reversed every other round."""
    jobs: list[tuple[str, str, Any]] = [
        (side, mode, lambda urls=urls, mode=mode: on_all(mode, urls, duration))
        for mode in MODES for side, urls in sides.items()]
    jobs.append(("serve", "handles", lambda: handle_calls(duration)))
    jobs.append(("awm", "http_calls", lambda: awm.calls(duration)))
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(rounds):
        for side, mode, job in (jobs if r % 2 == 0 else jobs[::-1]):
            runs.setdefault((side, mode), []).append(asyncio.run(job()))
    out: dict[str, dict] = {}
    for (side, mode), got in runs.items():
        out.setdefault(side, {})[mode] = median_run(got)
    return out


def sequential_latencies(urls: dict[str, str], floor_url: str, rounds: int, n: int) -> dict:
    """Lease acquire (both farms), Serve's floor and the farm's /healthz, alternating."""
    jobs = {"no_ray_lease_acquire": lambda: lease_latency(urls["no_ray"], n),
            "serve_lease_acquire": lambda: lease_latency(urls["serve"], n),
            "serve_floor_get": lambda: get_latency(floor_url, n),
            "serve_healthz": lambda: get_latency(urls["serve"] + "/healthz", n),
            "no_ray_healthz": lambda: get_latency(urls["no_ray"] + "/healthz", n)}
    runs: dict[str, list[dict]] = {k: [] for k in jobs}
    for r in range(rounds):
        for name in (list(jobs) if r % 2 == 0 else list(jobs)[::-1]):
            runs[name].append(asyncio.run(jobs[name]()))
    return {name: {"p50_ms": statistics.median(x["p50_ms"] for x in got),
                   "p99_ms": statistics.median(x["p99_ms"] for x in got),
                   "runs_p50_ms": [x["p50_ms"] for x in got], "n_per_run": n}
            for name, got in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per throughput run")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every (side, mode) job")
    ap.add_argument("--replicas", type=int, default=2, help="Serve pool replicas")
    ap.add_argument("--no-ray-procs", type=int, default=None,
                    help="--no-ray processes of the equal-count side (default: --replicas)")
    ap.add_argument("--awm", type=int, default=16, help="AWM baseline instances")
    ap.add_argument("--hold", type=int, default=1024, help="leases held at once")
    ap.add_argument("--locust-seconds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    d, rounds = (1.0, 1) if args.quick else (args.duration, args.rounds)
    procs_equal = args.no_ray_procs or args.replicas
    hold = 128 if args.quick else args.hold
    res: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                       "date": time.strftime("%Y-%m-%d %H:%M %Z"),
                                       "loadavg_start": os.getloadavg()},
                           "settings": {"duration_s": d, "rounds": rounds, "hold": hold,
                                        "replicas": args.replicas,
                                        "no_ray_procs_equal": procs_equal, "tool": TOOL,
                                        "env": ENV}}
    from envfarm.farm import FarmConfig, PoolConfig
    from envfarm.serve import DeploymentOptions, ServeOptions, start_farm

    started = [start_no_ray(warm=64) for _ in range(max(1, procs_equal))]
    proc, local_url = started[0]
    equal = f"no_ray_x{procs_equal}"
    awm = AwmBaseline(4 if args.quick else args.awm)
    t0 = time.perf_counter()
    port = free_port()
    farm = start_farm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=64)),
                      ServeOptions(port=port, num_cpus=2,
                                   deployment=DeploymentOptions(num_replicas=args.replicas)))
    res["serve_startup_s"] = round(time.perf_counter() - t0, 1)
    not_ray = {p.pid for p, _ in started} | {p.pid for p in awm.procs}
    try:
        floor_url = deploy_floor(port)
        sides = {"no_ray": [local_url], "serve": [farm.url]}
        if procs_equal > 1:
            sides[equal] = [u for _, u in started]
        got = interleaved(sides, awm, d, rounds)
        res["no_ray"], res["serve"], res["awm_calls"] = got["no_ray"], got["serve"], got["awm"]
        res[equal] = got.get(equal, {})
        res["sequential"] = sequential_latencies({"no_ray": local_url, "serve": farm.url},
                                                 floor_url, rounds, 50 if args.quick else 200)
        res["serve"]["lease_acquire_batch16"] = asyncio.run(lease_batch_latency(farm.url, 16, 40))
        res["no_ray"]["lease_acquire_batch16"] = asyncio.run(
            lease_batch_latency(local_url, 16, 40))
        res["serve"]["handle_lease_acquire"] = asyncio.run(handle_acquire())
        from ray import serve

        serve.delete("bench_floor")  # not counted in the Serve farm's memory below
        res["no_ray"]["hold"] = asyncio.run(hold_leases(
            local_url, hold, d, lambda: tree_memory(proc.pid, exclude_self=False)))
        res["serve"]["hold"] = asyncio.run(hold_leases(
            farm.url, hold, d, lambda: tree_memory(exclude=not_ray)))
        res["serve"]["memory_after_release"] = tree_memory(exclude=not_ray)
        secs = 5 if args.quick else args.locust_seconds
        res["no_ray"]["locust"] = run_locust(local_url, 20, secs)
        res["serve"]["locust"] = run_locust(farm.url, 20, secs)
    finally:
        farm.shutdown()
        for p, _ in started:
            p.terminate()
        for p, _ in started:
            p.wait(timeout=15)
        res["awm"] = {**awm.stop(), "calls": res.get("awm_calls", {}).get("http_calls")}
    res.pop("awm_calls", None)
    res["machine"]["loadavg_end"] = os.getloadavg()
    # The ceilings: the best --no-ray mode, one process and as many processes as Serve's replicas.
    res["ceiling_calls_per_s"] = max(res["no_ray"][k]["calls_per_s"] for k in CEILING_MODES)
    res["ceiling_mode"] = max(CEILING_MODES, key=lambda k: res["no_ray"][k]["calls_per_s"])
    ratios: dict[str, float] = {}
    if res[equal]:
        res["ceiling_equal_calls_per_s"] = max(res[equal][k]["calls_per_s"]
                                               for k in CEILING_MODES)
        res["ceiling_equal_mode"] = max(CEILING_MODES,
                                        key=lambda k: res[equal][k]["calls_per_s"])
    for k in (*MODES, "handles"):
        ratios[f"serve_{k}_vs_ceiling_1_process"] = round(
            res["serve"][k]["calls_per_s"] / res["ceiling_calls_per_s"], 2)
        if res[equal]:
            ratios[f"serve_{k}_vs_ceiling_{procs_equal}_processes"] = round(
                res["serve"][k]["calls_per_s"] / res["ceiling_equal_calls_per_s"], 2)
    res["ratios"] = ratios
    text = json.dumps(res, indent=2)
    print(text)
    print(render_markdown(res))
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
