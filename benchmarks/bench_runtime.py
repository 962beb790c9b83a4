"""Runtime benchmark: template build, reset, in-process tool calls, instances per GiB, and AWM's
way of getting a fresh instance (copy the DB file, start the env as its own uvicorn process,
wait until it lists its tools), side by side in one run.

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/bench_runtime.py'

Prints a markdown table and writes benchmarks/results/runtime.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from envfarm import EnvRuntime, build_template, load_catalog
from envfarm.check import example_arguments
from envfarm.errors import CatalogError

ROOT = Path(__file__).resolve().parents[1]
AWM = ROOT.parent / "shared" / "awm1k_samples"
# One simple read per env (tool, arguments); others fall back to the first GET that answers.
READS = {"content_platform_1": ("get_channel_by_id", {"channel_id": 1})}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pick_read(rt: EnvRuntime) -> tuple[str, dict]:
    if rt.name in READS:
        return READS[rt.name]
    inst = rt.instance()
    for op in rt.operations.values():
        if op.method == "GET":
            args = example_arguments(op.spec)
            if inst.call_sync(op.spec.name, args).ok:
                return op.spec.name, args
    raise RuntimeError(f"no read tool answers in {rt.name}")


async def time_calls(rt: EnvRuntime, tool: str, args: dict, n: int) -> list[float]:
    inst = rt.instance()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        res = await inst.call(tool, args)
        out.append(time.perf_counter() - t)
        assert res.ok, res.error
    return out


def bench_env(bundle, calls: int, resets: int) -> dict:
    t = time.perf_counter()
    build_template(bundle.db_schema, bundle.sample_data)
    template_ms = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    rt = EnvRuntime(bundle)
    load_ms = (time.perf_counter() - t) * 1000
    inst = rt.instance()
    reset_us = []
    for _ in range(resets):
        t = time.perf_counter()
        inst.reset()
        reset_us.append((time.perf_counter() - t) * 1e6)
    new_us = []
    for _ in range(200):
        t = time.perf_counter()
        rt.instance().close()
        new_us.append((time.perf_counter() - t) * 1e6)
    tool, args = pick_read(rt)
    call_s = asyncio.run(time_calls(rt, tool, args, calls))
    return {
        "env": rt.name, "tables": rt.template.tables, "rows": rt.template.rows,
        "tools": len(rt.tools), "db_kib": len(rt.template.data) / 1024,
        "template_build_ms": template_ms, "load_ms": load_ms,
        "reset_p50_us": statistics.median(reset_us), "reset_p99_us": pct(reset_us, 0.99),
        "new_instance_p50_us": statistics.median(new_us),
        "read_tool": tool, "call_p50_ms": statistics.median(call_s) * 1000,
        "call_p99_ms": pct(call_s, 0.99) * 1000,
    }


def memory_for(env_dir: str, env: str, n: int) -> dict:
    """RSS of n live instances of one env, measured in a fresh process."""
    code = f"""
import asyncio, json, sys
sys.path.insert(0, {str(ROOT)!r})
from benchmarks.bench_runtime import rss_mib, pick_read
from envfarm import EnvRuntime, load_catalog
base = rss_mib()
rt = EnvRuntime(load_catalog({env_dir!r})[{env!r}])
loaded = rss_mib()
tool, args = pick_read(rt)
insts = [rt.instance() for _ in range({n})]
async def touch():
    for i in insts:
        assert (await i.call(tool, args)).ok
asyncio.run(touch())
print(json.dumps({{"base_mib": base, "loaded_mib": loaded, "with_instances_mib": rss_mib()}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    m["instances"] = n
    m["per_instance_kib"] = (m["with_instances_mib"] - m["loaded_mib"]) * 1024 / n
    m["instances_per_gib"] = 1024 * 1024 / max(m["per_instance_kib"], 1e-9)
    return m


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def awm_fresh_instance(bundle, template: bytes, runs: int) -> dict:
    """AWM's way: copy the DB file, start the env as its own uvicorn process, wait for tools."""
    work = Path(tempfile.mkdtemp(prefix="awm_bench_"))
    src = work / "template.db"
    src.write_bytes(template)
    module = work / "env_server.py"
    module.write_text(bundle.code)
    times, rss = [], []
    for i in range(runs):
        port = free_port()
        t = time.perf_counter()
        db = work / f"run{i}.db"
        db.write_bytes(src.read_bytes())
        env = dict(os.environ, DATABASE_PATH=f"sqlite:///{db}", HOST="127.0.0.1", PORT=str(port))
        proc = subprocess.Popen([sys.executable, str(module)], env=env, cwd=work,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=1.0)
                    if r.status_code == 200 and r.json()["paths"]:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError("AWM-style env process exited")
                time.sleep(0.01)
            times.append(time.perf_counter() - t)
            with open(f"/proc/{proc.pid}/status") as fh:
                rss += [int(l.split()[1]) / 1024 for l in fh if l.startswith("VmRSS:")]
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return {"fresh_instance_p50_s": statistics.median(times), "runs": runs,
            "process_rss_mib": statistics.median(rss)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--resets", type=int, default=20000)
    ap.add_argument("--instances", type=int, default=1024)
    ap.add_argument("--awm-runs", type=int, default=5)
    args = ap.parse_args()
    catalogs = [("bundled", str(ROOT / "envfarm" / "catalog"))]
    if AWM.is_dir():
        catalogs.insert(0, ("awm", str(AWM)))
    rows = []
    for label, path in catalogs:
        try:
            cat = load_catalog(path)
        except CatalogError as exc:
            print(f"skipping {label}: {exc.message}", file=sys.stderr)
            continue
        for name in cat.servable:
            row = bench_env(cat[name], args.calls, args.resets)
            row["catalog"] = label
            rows.append(row)
            print(f"measured {name}", file=sys.stderr)
    label, path = catalogs[0]
    env = "content_platform_1" if label == "awm" else load_catalog(path).servable[0]
    memory = memory_for(path, env, args.instances)
    bundle = load_catalog(path)[env]
    rt = EnvRuntime(bundle)
    awm = awm_fresh_instance(bundle, rt.template.data, args.awm_runs)
    ours = next(r for r in rows if r["env"] == env)
    result = {
        "machine": f"{platform.node()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"), "envs": rows, "memory": {"env": env, **memory},
        "awm_way": {"env": env, **awm,
                    "ratio_vs_reset": awm["fresh_instance_p50_s"] * 1e6 / ours["reset_p50_us"],
                    "ratio_vs_new_instance":
                        awm["fresh_instance_p50_s"] * 1e6 / ours["new_instance_p50_us"]},
    }
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "runtime.json").write_text(json.dumps(result, indent=2))
    print("| catalog | env | tables | rows | tools | template build ms | load ms | reset p50/p99 µs "
          "| new instance p50 µs | read tool | call p50/p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['catalog']} | {r['env']} | {r['tables']} | {r['rows']} | {r['tools']} "
              f"| {r['template_build_ms']:.1f} | {r['load_ms']:.0f} "
              f"| {r['reset_p50_us']:.1f} / {r['reset_p99_us']:.1f} | {r['new_instance_p50_us']:.0f} "
              f"| {r['read_tool']} | {r['call_p50_ms']:.3f} / {r['call_p99_ms']:.3f} |")
    m = result["memory"]
    print(f"\nmemory ({m['env']}): process {m['base_mib']:.0f} MiB -> env loaded "
          f"{m['loaded_mib']:.0f} MiB -> {m['instances']} instances {m['with_instances_mib']:.0f} "
          f"MiB; {m['per_instance_kib']:.0f} KiB/instance, {m['instances_per_gib']:.0f} instances/GiB")
    a = result["awm_way"]
    print(f"AWM way ({a['env']}): fresh instance p50 {a['fresh_instance_p50_s'] * 1000:.0f} ms, "
          f"{a['process_rss_mib']:.0f} MiB per process; ours: reset x{a['ratio_vs_reset']:.0f} "
          f"faster, new instance x{a['ratio_vs_new_instance']:.0f} faster")


if __name__ == "__main__":
    main()
