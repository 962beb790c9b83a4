"""Runtime benchmark: template build, reset, in-process tool calls, instances per GiB, and AWM's
ways of getting a clean instance, side by side in one run:

- AWM's reset: copy the template DB file over the instance's file (same filesystem);
- AWM's fresh instance: copy the DB file, start the env as its own uvicorn process, wait until it
  lists its tools;
- envfarm's per-call overhead: ``Instance.call`` vs a bare in-process ASGI call of the same
  endpoint of the same env code (AWM's way: a SQLite file on tmpfs), interleaved in one process.

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/runtime/bench_runtime.py'

Prints a markdown table and writes benchmarks/results/runtime.json (``--quick``: a short smoke
run that writes nothing unless ``--json`` is given).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from envfarm import EnvRuntime, build_template, load_catalog
from envfarm.confined.probing import example_arguments
from envfarm.errors import CatalogError

from benchmarks._awm import awm_samples

ROOT = Path(__file__).resolve().parents[2]
AWM = awm_samples()  # optional: the AWM-1K catalog joins the runs when present
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


class AwmResetCopy:
    """AWM's reset: copy the template DB file to the instance's path, in one folder. Two ways,
    alternating: over the existing file, and to a new file renamed over it (cheaper on ext4 here:
    no truncate of the old blocks). The cheaper one is the baseline."""

    def __init__(self, template: bytes) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="awm_reset_"))
        self.src, self.dst = self.work / "template.db", self.work / "instance.db"
        self.src.write_bytes(template)
        self.dst.write_bytes(template)
        self.overwrite: list[float] = []
        self.replace: list[float] = []

    def once(self) -> None:
        t = time.perf_counter()
        shutil.copyfile(self.src, self.dst)
        self.overwrite.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        shutil.copyfile(self.src, self.work / "next.db")
        os.replace(self.work / "next.db", self.dst)
        self.replace.append((time.perf_counter() - t) * 1e6)

    def result(self) -> dict:
        shutil.rmtree(self.work)
        over, repl = statistics.median(self.overwrite), statistics.median(self.replace)
        best = self.replace if repl <= over else self.overwrite
        return {"awm_reset_copy_p50_us": min(over, repl),
                "awm_reset_copy_p99_us": pct(best, 0.99),
                "awm_reset_copy_way": "copy + rename" if repl <= over else "overwrite",
                "awm_reset_overwrite_p50_us": over, "awm_reset_copy_rename_p50_us": repl,
                "awm_reset_copies": len(self.overwrite), "awm_reset_copy_dir":
                str(self.work.parent), "awm_reset_copy_fs": fs_type(self.work.parent)}


def fs_type(path: Path) -> str:
    """The filesystem type holding path (the longest matching mount point in /proc/mounts)."""
    best, kind = "", "?"
    with open("/proc/mounts") as fh:
        for line in fh:
            _, mount, fs, *_ = line.split()
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fs
    return kind


def bench_env(bundle, calls: int, resets: int) -> dict:
    t = time.perf_counter()
    build_template(bundle.db_schema, bundle.sample_data)
    template_ms = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    rt = EnvRuntime(bundle)
    load_ms = (time.perf_counter() - t) * 1000
    inst = rt.instance()
    reset_us = []
    copy = AwmResetCopy(rt.template.data)
    for i in range(resets):
        t = time.perf_counter()
        inst.reset()
        reset_us.append((time.perf_counter() - t) * 1e6)
        if i % 20 == 0:  # AWM's reset, sampled through the same stretch of time
            copy.once()
    new_us = []
    for _ in range(200):
        t = time.perf_counter()
        rt.instance().close()
        new_us.append((time.perf_counter() - t) * 1e6)
    tool, args = pick_read(rt)
    call_s = asyncio.run(time_calls(rt, tool, args, calls))
    reset_p50 = statistics.median(reset_us)
    awm_reset = copy.result()
    return {**awm_reset, "reset_vs_awm_copy": awm_reset["awm_reset_copy_p50_us"] / reset_p50,

        "env": rt.name, "tables": rt.template.tables, "rows": rt.template.rows,
        "tools": len(rt.tools), "db_kib": len(rt.template.data) / 1024,
        "template_build_ms": template_ms, "load_ms": load_ms,
        "reset_p50_us": reset_p50, "reset_p99_us": pct(reset_us, 0.99),
        "new_instance_p50_us": statistics.median(new_us),
        "read_tool": tool, "read_args": args, "call_p50_ms": statistics.median(call_s) * 1000,
        "call_p99_ms": pct(call_s, 0.99) * 1000,
    }


def memory_for(env_dir: str, env: str, n: int) -> dict:
    """RSS of n live instances of one env, measured in a fresh process."""
    code = f"""
import asyncio, json, sys
sys.path.insert(0, {str(ROOT)!r})
from benchmarks.runtime.bench_runtime import rss_mib, pick_read
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


async def bare_asgi(app, method: str, path: str, query: str) -> tuple[int, bytes]:
    """The least an in-process call of an ASGI endpoint can do: one scope, receive, send."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": query.encode(), "headers": [(b"host", b"bare")],
             "client": ("127.0.0.1", 0), "server": ("bare", 80), "state": {}}
    status, chunks = 500, []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def overhead_child(env_dir: str, env: str, tool: str, args: dict, rounds: int, calls: int
                   ) -> dict:
    """In a fresh process: Instance.call vs a bare ASGI call of the same endpoint, the env's
    code loaded AWM's way (module import, DATABASE_PATH = a SQLite file on tmpfs), alternating
    call by call."""
    import importlib.util
    from urllib.parse import urlencode

    bundle = load_catalog(env_dir)[env]
    work = Path(tempfile.mkdtemp(prefix="bare_env_", dir="/dev/shm"
                                 if os.access("/dev/shm", os.W_OK) else None))
    rt = EnvRuntime(bundle)
    (work / "bare.db").write_bytes(rt.template.data)
    (work / "bare_env.py").write_text(bundle.code)
    os.environ["DATABASE_PATH"] = f"sqlite:///{work / 'bare.db'}"
    spec = importlib.util.spec_from_file_location("bare_env", work / "bare_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    op = rt.operations[tool]
    path, rest = op.path, dict(args)
    for name in list(rest):
        if "{" + name + "}" in path:
            path = path.replace("{" + name + "}", str(rest.pop(name)))
    query = urlencode(rest)
    inst = rt.instance()

    async def run() -> tuple[list[float], list[float]]:
        # Call by call, alternating which side goes first: both sides see the same load.
        ours, bare = [], []
        for i in range(rounds * calls):
            for side in ((0, 1) if i % 2 else (1, 0)):
                t = time.perf_counter()
                if side == 0:
                    res = await inst.call(tool, args)
                    ours.append(time.perf_counter() - t)
                    assert res.ok, res.error
                else:
                    status, body = await bare_asgi(module.app, op.method, path, query)
                    bare.append(time.perf_counter() - t)
                    assert status == 200, (status, body[:200])
        return ours, bare

    ours, bare = asyncio.run(run())
    shutil.rmtree(work)
    ours_ms, bare_ms = statistics.median(ours) * 1e3, statistics.median(bare) * 1e3
    per_round = [(statistics.median(ours[i:i + calls]) - statistics.median(bare[i:i + calls]))
                 * 1e6 for i in range(0, len(ours), calls)]
    return {"tool": tool, "calls": len(ours), "rounds": rounds, "envfarm_call_p50_ms": ours_ms,
            "bare_asgi_p50_ms": bare_ms, "overhead_p50_us": (ours_ms - bare_ms) * 1e3,
            "overhead_per_round_us": per_round,
            "paired_difference_p50_us": statistics.median(
                (a - b) * 1e6 for a, b in zip(ours, bare)),
            "bare_db": "SQLite file on " + fs_type(work)}


def call_overhead(env_dir: str, env: str, tool: str, args: dict, rounds: int, calls: int
                  ) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from benchmarks.runtime.bench_runtime import overhead_child\n"
            f"print(json.dumps(overhead_child({env_dir!r}, {env!r}, {tool!r}, {args!r}, "
            f"{rounds}, {calls})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    ap.add_argument("--overhead-rounds", type=int, default=5)
    ap.add_argument("--overhead-calls", type=int, default=300, help="calls per side and round")
    ap.add_argument("--quick", action="store_true", help="short smoke run")
    ap.add_argument("--json", type=Path, help="where to write the raw numbers (default: "
                    "benchmarks/results/runtime.json; --quick writes only where told)")
    args = ap.parse_args()
    if args.quick:
        args.calls, args.resets, args.instances, args.awm_runs = 200, 1000, 64, 1
        args.overhead_rounds, args.overhead_calls = 2, 50
    catalogs = [("bundled", str(ROOT / "envfarm" / "catalog"))]
    if AWM.is_dir():
        catalogs.insert(0, ("awm", str(AWM)))
    load_start = os.getloadavg()
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
            row["overhead"] = call_overhead(path, name, row["read_tool"], row["read_args"],
                                            args.overhead_rounds, args.overhead_calls)
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
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(), "settings": vars(args) | {"json": str(args.json)},
        "envs": rows, "memory": {"env": env, **memory},
        "awm_way": {"env": env, **awm,
                    "awm_reset_copy_p50_us": ours["awm_reset_copy_p50_us"],
                    "reset_vs_awm_copy": ours["reset_vs_awm_copy"],
                    "ratio_vs_reset": awm["fresh_instance_p50_s"] * 1e6 / ours["reset_p50_us"],
                    "ratio_vs_new_instance":
                        awm["fresh_instance_p50_s"] * 1e6 / ours["new_instance_p50_us"]},
    }
    target = args.json or (None if args.quick else ROOT / "benchmarks" / "results" / "runtime.json")
    if target is not None:
        target.parent.mkdir(exist_ok=True)
        target.write_text(json.dumps(result, indent=2))
    print(render_markdown(result))


def render_markdown(result: dict) -> str:
    """RESULTS.md's Runtime tables, from one run's JSON."""
    lines = ["| catalog | env | tables | rows | tools | template build ms | load ms "
             "| reset p50 / p99 µs | AWM reset p50 µs: overwrite / copy + rename | x (vs cheaper) "
             "| new instance p50 µs |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["envs"]:
        lines.append(
            f"| {r['catalog']} | {r['env']} | {r['tables']} | {r['rows']} | {r['tools']} "
            f"| {r['template_build_ms']:.1f} | {r['load_ms']:.0f} "
            f"| {r['reset_p50_us']:.1f} / {r['reset_p99_us']:.1f} "
            f"| {r['awm_reset_overwrite_p50_us']:.0f} / {r['awm_reset_copy_rename_p50_us']:.0f} "
            f"| {r['reset_vs_awm_copy']:.0f} "
            f"| {r['new_instance_p50_us']:.0f} |")
    lines += ["", "| env | read tool | call p50 / p99 ms | same run, interleaved: envfarm call p50 "
              "ms | bare ASGI p50 ms | overhead µs: difference of p50s / p50 of paired differences |",
              "|---|---|---|---|---|---|"]
    for r in result["envs"]:
        o = r["overhead"]
        lines.append(f"| {r['env']} | {r['read_tool']} | {r['call_p50_ms']:.3f} / "
                     f"{r['call_p99_ms']:.3f} | {o['envfarm_call_p50_ms']:.3f} "
                     f"| {o['bare_asgi_p50_ms']:.3f} | {o['overhead_p50_us']:.0f} / "
                     f"{o['paired_difference_p50_us']:.0f} |")
    m = result["memory"]
    lines.append(f"\nmemory ({m['env']}): process {m['base_mib']:.0f} MiB -> env loaded "
                 f"{m['loaded_mib']:.0f} MiB -> {m['instances']} instances "
                 f"{m['with_instances_mib']:.0f} MiB; {m['per_instance_kib']:.0f} KiB/instance, "
                 f"{m['instances_per_gib']:.0f} instances/GiB")
    a = result["awm_way"]
    lines.append(f"AWM way ({a['env']}): reset = file copy {a['awm_reset_copy_p50_us']:.0f} µs "
                 f"(ours x{a['reset_vs_awm_copy']:.0f} faster); fresh instance = new process "
                 f"{a['fresh_instance_p50_s'] * 1000:.0f} ms p50, {a['process_rss_mib']:.0f} MiB "
                 f"(x{a['ratio_vs_reset']:.0f} a reset, x{a['ratio_vs_new_instance']:.0f} a new "
                 "instance of ours)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
