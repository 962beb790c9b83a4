"""AWM-1K scale on one node: a farm of 1,000 env types loaded on demand (issue 26's targets).

Starts ``envfarm serve --no-ray`` (jailed env workers) on a generated 1,000-type catalog
(``tests/fakes/catalog_1k.py``, one type broken on purpose) and measures, over HTTP:

- ready: seconds from the process start to ``/healthz`` answering (target <= 60 s);
- first lease of a cold type (cold start: a spare worker loads the code) and of a warm one
  (p50 targets 2 s and 2 ms; the warm one also as the farm's own part, read from
  ``envfarm_lease_acquire_seconds`` around it), the probe's share (first clone of a code vs
  later clones);
- a trainer-like loop: ``--steps`` steps, each 16 leases x 64 types never used before
  (1,024 leases), one tool call per lease, all released; 0 errors expected; total PSS of the
  farm and every worker at the step's peak (target <= 8 GiB); between steps a pause as long
  as the eviction idle time (a trainer trains between rollout phases);
- memory after eviction (idle types' workers stopped).

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/farm/bench_on_demand.py'
        [--types 1000] [--steps 3] [--step-types 64] [--per-type 16] [--source AWM_FOLDER]
        [--max-loaded 128] [--pause S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.boundary.bench_boundary import pss_mib
from tests.fakes.catalog_1k import make_catalog

OUT = REPO / "benchmarks" / "results" / "on_demand.json"


def _p50_ms(values: list[float]) -> float | None:
    return round(statistics.median(values) * 1000, 2) if values else None


async def _lease(client, env: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = await client.post(f"/envs/{env}/leases", json={})
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return elapsed, r.json()


async def _release(client, info: dict) -> None:
    r = await client.delete(f"/envs/{info['env']}/leases/{info['lease_id']}",
                            headers={"Authorization": f"Bearer {info['token']}"})
    r.raise_for_status()


async def _acquire_sums_s(client) -> dict[str, float]:
    """The farm's own time in lease creation so far, per env: the sums of its
    ``envfarm_lease_acquire_seconds`` histogram (from the request's arrival in the core to
    the lease's record; no HTTP, no JSON)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = (await client.get("/metrics")).text
    return {s.labels["env"]: s.value for family in text_string_to_metric_families(text)
            if family.name == "envfarm_lease_acquire_seconds"
            for s in family.samples if s.name.endswith("_sum")}


async def first_leases(client, envs: list[str], bases_seen: set[str]) -> dict[str, Any]:
    """A cold lease of each type, one type at a time, then a warm one of each; the warm
    leases' own part in the farm is read from ``/metrics`` before and after them (scraped
    outside the timed requests; the HTTP round trip is the rest)."""
    probed, cached, warm, held = [], [], [], []
    for env in envs:
        cold_s, info = await _lease(client, env)
        base = env.split("__c")[0]
        (cached if base in bases_seen else probed).append(cold_s)
        bases_seen.add(base)
        held.append(info)
    before = await _acquire_sums_s(client)
    for env in envs:
        warm_s, info = await _lease(client, env)
        warm.append(warm_s)
        held.append(info)
    after = await _acquire_sums_s(client)
    warm_farm = [after[env] - before[env] for env in envs]
    floor = []  # this machine's HTTP round trip right now: a request that does nothing
    for _ in envs:
        t0 = time.perf_counter()
        (await client.get("/healthz")).raise_for_status()
        floor.append(time.perf_counter() - t0)
    for info in held:
        await _release(client, info)
    return {"cold_p50_ms": _p50_ms(probed + cached), "cold_probed_p50_ms": _p50_ms(probed),
            "cold_probe_cached_p50_ms": _p50_ms(cached), "warm_p50_ms": _p50_ms(warm),
            "warm_in_farm_p50_ms": round(statistics.median(warm_farm) * 1000, 3),
            "warm_in_farm_max_ms": round(max(warm_farm) * 1000, 3),
            "healthz_p50_ms": _p50_ms(floor),
            "cold_n": len(probed + cached)}


async def step(client, envs: list[str], per_type: int, farm_pid: int) -> dict[str, Any]:
    """``per_type`` leases of each env, one tool call on each, all released."""
    errors: list[str] = []
    gate = asyncio.Semaphore(64)  # concurrent requests, as a trainer's rollout workers

    async def one(env: str) -> dict | None:
        async with gate:
            stage = "lease"
            try:
                _, info = await _lease(client, env)
                auth = {"Authorization": f"Bearer {info['token']}"}
                path = f"/envs/{env}/leases/{info['lease_id']}"
                stage = "tools"
                tools = (await client.get(path + "/tools", headers=auth)).json()
                stage = "call"
                r = await client.post(path + "/call", headers=auth,
                                      json={"tool": tools[0]["name"], "arguments": {}})
                body = r.json()
                if r.status_code != 200 or not (body["ok"] or body["error"]["kind"]
                                                == "agent_error"):
                    errors.append(f"{env}: call {r.status_code} {r.text[:200]}")
                return info
            except Exception as exc:  # noqa: BLE001 - each one is counted: the target is 0
                errors.append(f"{env}: {stage}: {type(exc).__name__} {str(exc)[:200]} "
                              f"{exc.__cause__!r}")
                return None

    t0 = time.perf_counter()
    held = await asyncio.gather(*(one(e) for e in envs for _ in range(per_type)))
    leased_s = time.perf_counter() - t0
    peak = pss_mib(farm_pid)
    for info in held:
        if info is not None:
            await _release(client, info)
    return {"types": len(envs), "leases": len(envs) * per_type,
            "ok_leases": sum(i is not None for i in held), "errors": len(errors),
            "first_errors": errors[:5], "lease_and_call_all_s": round(leased_s, 1),
            "pss_mib_peak": peak}


async def drive(url: str, farm_pid: int, names: list[str], args) -> dict[str, Any]:
    import httpx

    # keepalive_expiry under uvicorn's 5 s keep-alive, as the SDK does: a reused idle
    # connection otherwise races the server's close (a ReadError that is the client's).
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(
            max_connections=128, keepalive_expiry=3.0)) as client:
        ok = [n for n in names if not n.endswith(f"__c{args.types - 1:04d}")]  # not the broken
        out: dict[str, Any] = {"pss_mib_idle": pss_mib(farm_pid)}
        seen: set[str] = set()
        out["first_lease"] = await first_leases(client, ok[:args.cold_samples], seen)
        broken = await client.post(f"/envs/{names[-1]}/leases", json={})
        out["broken_type"] = {"status": broken.status_code,
                              "type": broken.json().get("error", {}).get("type")}
        out["steps"] = []
        start = args.cold_samples
        for k in range(args.steps):
            envs = ok[start + k * args.step_types:start + (k + 1) * args.step_types]
            out["steps"].append(await step(client, envs, args.per_type, farm_pid))
            print(json.dumps(out["steps"][-1]), flush=True)
            await asyncio.sleep(args.pause)  # the trainer trains; idle types go
            out["steps"][-1]["pss_mib_after_eviction"] = pss_mib(farm_pid)
        out["types"] = (await client.get("/status.json")).json()["types"]
    return out


def cold_start_cpu(sources: list[Path] | None) -> dict[str, Any]:
    """CPU-seconds of one cold start per source env, in the worker that loads it (what a
    quiet machine's wall time would be), with the module-state probe and without (its verdict
    known): the worker's CPU after the load less that of a worker that only got ready."""
    import psutil

    from envfarm.catalog import BUNDLED_CATALOG, load_catalog
    from envfarm.worker import WorkerEnv, WorkerOptions, WorkerProcess

    def cpu(pid: int) -> float:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system

    options = WorkerOptions()
    idle = WorkerProcess(options.worker_config())
    time.sleep(15)  # imports and the jail done; it waits for a load it never gets
    ready_cpu = cpu(idle.pid)
    idle.kill()
    out: dict[str, Any] = {"worker_ready_cpu_s": round(ready_cpu, 2), "types": {}}
    for source in sources or [BUNDLED_CATALOG]:
        catalog = load_catalog(source, check_code=False)
        for name in catalog.servable:
            row = {}
            for probe in (True, False):
                served = WorkerEnv(catalog[name], options, module_state=None if probe else [])
                row["probe_cpu_s" if probe else "no_probe_cpu_s"] = round(
                    cpu(served.workers[0].pid) - ready_cpu, 2)
                served.kill_all("measured")
            out["types"][name] = row
    rows = list(out["types"].values())
    out["median_probe_cpu_s"] = statistics.median(r["probe_cpu_s"] for r in rows)
    out["median_no_probe_cpu_s"] = statistics.median(r["no_probe_cpu_s"] for r in rows)
    return out


class _Laps(dict):
    """CPU milliseconds per stage, each lap since the last."""

    def __init__(self) -> None:
        super().__init__()
        self.mark = time.process_time()

    def lap(self, stage: str) -> None:
        now = time.process_time()
        self[stage] = round((now - self.mark) * 1000, 1)
        self.mark = now


def cold_start_stages(sources: list[Path] | None) -> dict[str, Any]:
    """Where a cold start's CPU goes, stage by stage (CPU ms), replayed in this process as a
    worker does it (without the jail): the front encodes the ``load`` message, the worker
    decodes it, runs the env's module and builds its database, reads its tools (and the
    OpenAPI of its MCP listing: one generation), probes module state, and encodes its reply;
    the front decodes it and renders the MCP listing. Plus the worker's own start (imports)."""
    import asyncio as aio

    started = time.process_time()
    import fastapi  # noqa: F401 - what a worker imports before its jail
    import sqlalchemy.orm  # noqa: F401

    import envfarm.runtime
    imports_ms = (time.process_time() - started) * 1000
    from envfarm import _binding
    from envfarm._tools import extract_operations, openapi_for_tools
    from envfarm.catalog import BUNDLED_CATALOG, load_catalog
    from envfarm.check import module_state_leaks
    from envfarm.farm._schemas import render_tools
    from envfarm.models import EnvBundle, ToolSpec
    from envfarm.template import build_template
    from envfarm.worker import _frames

    rows: dict[str, dict[str, float]] = {}
    for source in sources or [BUNDLED_CATALOG]:
        catalog = load_catalog(source, check_code=False)
        for name in catalog.servable:
            row = _Laps()
            lap = row.lap
            frame = _frames.encode({"op": "load", "bundle": catalog[name].model_dump(
                mode="json", include={"name", "code", "db_schema", "sample_data", "api_spec"})})
            lap("front_encode_load")
            bundle = EnvBundle.model_validate(_frames.decode(frame[4:])[0]["bundle"])
            lap("worker_decode_load")
            module_ms: list[float] = []

            def load(conn, bundle=bundle, module_ms=module_ms) -> None:
                t0 = time.process_time()
                _binding.load_module(bundle.name, bundle.code, conn)
                module_ms.append((time.process_time() - t0) * 1000)

            build_template(bundle.db_schema, bundle.sample_data, before_inserts=load)
            lap("module_and_database")
            row["of_which_module"] = round(module_ms[0], 1)
            runtime = envfarm.runtime.EnvRuntime(bundle)  # again: its tools, timed below
            row.mark = time.process_time()
            runtime.operations, _ = extract_operations(runtime.app,
                                                       openapi_for_tools(runtime.app))
            lap("tools_and_openapi")
            aio.run(module_state_leaks(runtime))
            lap("probe")
            reply = _frames.encode({"tools": [t.model_dump() for t in runtime.tools],
                                    "openapi": runtime.mcp_openapi()}, runtime.template.data)
            lap("worker_encode_reply")

            head = _frames.decode(reply[4:])[0]
            render_tools(SimpleNamespace(name=name, openapi=head["openapi"], tools=[
                ToolSpec.model_validate(t) for t in head["tools"]]))
            lap("front_decode_and_render")
            row["load_kb"], row["reply_kb"] = len(frame) // 1024, len(reply) // 1024
            rows[name] = dict(row)
    stages = [k for k in next(iter(rows.values())) if not k.endswith("_kb")]
    return {"worker_imports_ms": round(imports_ms, 1), "types": rows,
            "median_ms": {k: round(statistics.median(r[k] for r in rows.values()), 1)
                          for k in stages}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--step-types", type=int, default=64)
    parser.add_argument("--per-type", type=int, default=16)
    parser.add_argument("--cold-samples", type=int, default=12)
    parser.add_argument("--evict-idle", type=float, default=15.0)
    parser.add_argument("--pause", type=float, help="seconds between steps (default: "
                        "--evict-idle + 3, so every idle type is evicted in between)")
    parser.add_argument("--max-loaded", type=int, default=128,
                        help="the farm's cap on loaded types (with --pause 0 and a cap of "
                             "--step-types, each step's types evict the last step's)")
    parser.add_argument("--source", type=Path, action="append")
    parser.add_argument("--port", type=int, default=8771)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--cold-cpu", action="store_true",
                        help="only measure the CPU of one cold start per source env")
    parser.add_argument("--cold-stages", action="store_true",
                        help="only split one cold start's CPU into its stages, per source env")
    args = parser.parse_args()
    if args.pause is None:
        args.pause = args.evict_idle + 3
    if args.cold_stages:
        result = cold_start_stages(args.source)
        out = args.out if args.out != OUT else OUT.parent / "on_demand_cold_stages.json"
        out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result["median_ms"], indent=1))
        return
    if args.cold_cpu:
        result = cold_start_cpu(args.source)
        out = args.out if args.out != OUT else OUT.parent / "on_demand_cold_cpu.json"
        out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
        return

    import httpx

    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="envfarm-1k-") as tmp:
        names = make_catalog(Path(tmp), args.types, args.source, broken=1)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        farm_log = args.out.with_suffix(".farm.log").open("w")  # its warnings, if any
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", "from envfarm.cli import app; app()", "serve", "--no-ray",
             "--catalog", tmp, "--port", str(args.port), "--evict-idle", str(args.evict_idle),
             "--max-loaded", str(args.max_loaded)],
            env=env, stdout=subprocess.DEVNULL, stderr=farm_log)
        url = f"http://127.0.0.1:{args.port}"
        try:
            while True:
                try:
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    raise SystemExit("the farm exited during start-up")
                time.sleep(0.2)
            ready_s = time.perf_counter() - t0
            print(f"ready in {ready_s:.1f} s", flush=True)
            result = asyncio.run(drive(url, proc.pid, names, args))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            farm_log.close()
    result = {"machine": f"{platform.node()} ({os.cpu_count()} cores)",
              "load_average_start": load_at_start, "load_average": os.getloadavg(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "catalog_types": args.types, "max_loaded": args.max_loaded, "pause_s": args.pause,
              "ready_s": round(ready_s, 1), **result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
