"""CPU per tool call (issue 24): the farm, all of its processes counted (front + env workers),
against AWM's own process serving the same env, the same tool, from the same client (wrk).

CPU-per-call rather than wall figures: the machine these run on is shared, and a process's CPU
time per request does not depend on how often the scheduler hands it a core. Per round and per
system, interleaved: wrk at 32 connections over 32 leases (HTTP ``/call`` and MCP
``tools/call``; AWM's process has only its REST route), the process tree's CPU seconds over the
middle of the run divided by the requests answered in it; then one connection for the p50.

``--pin`` adds rounds with the processes on fixed CPUs: the farm's front on CPU 0 and its env
workers on CPU 1, AWM's process on CPU 0 (wrk unpinned in both): how much of a call's CPU is
processes evicting each other's caches on a shared core?

``--profile SECONDS`` also samples the --no-ray front and one env worker with py-spy under the
32-connection HTTP load and prints each one's CPU share by stage (raw stacks kept in the JSON).

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/farm/bench_percall.py'
Raw results: benchmarks/results/percall.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.serve.bench_dataplane import (
    AWM,
    ENV,
    LEASES,
    TOOL,
    Farm,
    call_requests,
    check_calls,
    leases,
    release,
    wrk,
)

OUT = REPO / "benchmarks" / "results" / "percall.json"
PY_SPY = str(Path(sys.executable).with_name("py-spy"))

#: Stages of a call, by the first frame (innermost wins) whose "function (file)" has one of
#: these substrings; everything else is "other".
STAGES = [
    ("env code + SQLite", ("awm_env", "sqlalchemy", "sqlite3")),
    ("ASGI into env app (FastAPI/starlette)", ("envfarm/asgi", "fastapi/", "starlette/",
                                               "pydantic")),
    ("runtime guard/snapshot/rollback", ("envfarm/confined/runtime", "envfarm/confined/_guard",
                                         "envfarm/confined/_sqlite_guard",
                                         "envfarm/confined/_binding")),
    ("worker channel (frames)", ("envfarm/worker", "envfarm/confined/frames")),
    ("HTTP server (uvicorn/h11/httptools)", ("uvicorn/", "h11/", "httptools")),
    ("farm fast path + core + metrics", ("envfarm/farm", "prometheus_client")),
    ("JSON", ("json/",)),
    ("asyncio event loop", ("asyncio/", "uvloop")),
]


def tree_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of a process, and of it and all its descendants, now."""
    import psutil

    own = total = 0.0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
        if proc is root:
            own = t.user + t.system
    return own, total


def cpu_per_call(pid: int, url: str, requests: list, conns: int, seconds: float
                 ) -> dict[str, Any]:
    """wrk at ``conns``; the tree's CPU over the run's middle divided by the calls in it."""
    out: list[dict] = []
    runner = threading.Thread(target=lambda: out.append(wrk(url, requests, conns, seconds)))
    runner.start()
    time.sleep(1)
    (r0, c0), t0 = tree_cpu(pid), time.perf_counter()
    time.sleep(max(0.5, seconds - 2))
    (r1, c1), dt = tree_cpu(pid), time.perf_counter() - t0
    runner.join()
    res = out[0]
    calls = res["req_per_s"] * dt
    return {**res, "cpu_cores": round((c1 - c0) / dt, 3),
            "cpu_us_per_call": round((c1 - c0) / calls * 1e6, 1),
            # the root process alone: the farm's front (its workers are the rest)
            "front_us_per_call": round((r1 - r0) / calls * 1e6, 1)}


def _stage(frame: str) -> str:
    for name, keys in STAGES:
        if any(k in frame for k in keys):
            return name
    return "other"


def summarize_stacks(raw: str) -> dict[str, float]:
    """Share of samples by stage (a sample counts for the innermost frame's stage that is not
    'other' walking outwards; idle samples are dropped by py-spy without --idle)."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        stage = next((s for s in map(_stage, reversed(frames)) if s != "other"), "other")
        counts[stage] += int(n)
    total = sum(counts.values()) or 1
    return {k: round(v / total, 3) for k, v in counts.most_common()}


def py_spy(pid: int, seconds: float) -> subprocess.Popen:
    fd, path = tempfile.mkstemp(suffix=".txt")
    os.close(fd)
    proc = subprocess.Popen([PY_SPY, "record", "-p", str(pid), "-d", str(int(seconds)),
                             "-r", "200", "-f", "raw", "-o", path, "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.out_path = path  # type: ignore[attr-defined]
    return proc


def profile_farm(farm: Farm, held: list, seconds: float) -> dict[str, Any]:
    import psutil

    workers = [p.pid for p in psutil.Process(farm.proc.pid).children(recursive=True)
               if "envfarm.confined" in " ".join(p.cmdline())]
    targets = {"front": farm.proc.pid, **({"worker": workers[0]} if workers else {})}
    spies = {name: py_spy(pid, seconds) for name, pid in targets.items()}
    wrk(farm.url, call_requests(held, False), LEASES, seconds + 2)
    out = {}
    for name, proc in spies.items():
        proc.wait(timeout=60)
        raw = Path(proc.out_path).read_text()  # type: ignore[attr-defined]
        os.unlink(proc.out_path)  # type: ignore[attr-defined]
        out[name] = {"stages": summarize_stacks(raw), "samples": sum(
            int(line.rpartition(" ")[2]) for line in raw.splitlines()
            if line.rpartition(" ")[2].isdigit()), "raw": raw}
    return out


def pin(pid: int, children_cpu: int | None) -> None:
    """``pid`` on CPU 0 and its descendants on ``children_cpu``; None: every CPU again."""
    import psutil

    every = os.sched_getaffinity(0)  # this process is never pinned
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        cpus = every if children_cpu is None else {0} if proc is root else {children_cpu}
        try:
            proc.cpu_affinity(sorted(cpus))
            for thread in proc.threads():  # affinity is per thread on Linux
                psutil.Process(thread.id).cpu_affinity(sorted(cpus))
        except psutil.NoSuchProcess:  # ended meanwhile; any other failure must not pass silently
            continue


def measure_farm(farm: Farm, seconds: float, pinned: bool = False) -> dict[str, Any]:
    held = leases(farm.url, LEASES)
    if pinned:
        pin(farm.proc.pid, 1)
    try:
        check_calls(farm.url, held)
        return {
            "http_32": cpu_per_call(farm.proc.pid, farm.url, call_requests(held, False),
                                    LEASES, seconds),
            "mcp_32": cpu_per_call(farm.proc.pid, farm.url, call_requests(held, True),
                                   LEASES, seconds),
            "http_1": wrk(farm.url, call_requests(held[:1], False), 1, seconds),
        }
    finally:
        if pinned:
            pin(farm.proc.pid, None)
        release(farm.url, held)


def measure_awm(awm: AWM, seconds: float, pinned: bool = False) -> dict[str, Any]:
    req = [(awm.op.method.upper(), awm.op.path, {}, "")]
    if pinned:
        pin(awm.procs[0].pid, 1)
    try:
        return {"http_32": cpu_per_call(awm.procs[0].pid, awm.urls[0], req, LEASES, seconds),
                "http_1": wrk(awm.urls[0], req, 1, seconds)}
    finally:
        if pinned:
            pin(awm.procs[0].pid, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="wrk duration per figure")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--kinds", default="no-ray,no-ray+in-process",
                    help="farm kinds (bench_dataplane.Farm), comma-separated")
    ap.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                    help="py-spy the first farm kind's front and a worker for this long")
    ap.add_argument("--baseline", type=Path, metavar="DIR",
                    help="also run the first farm kind from this checkout (e.g. `git archive "
                         "main | tar -x -C DIR`), as 'baseline' in the same rounds")
    ap.add_argument("--pin", action="store_true",
                    help="also pinned rounds: front / AWM's process on CPU 0, env workers on 1")
    ap.add_argument("--note", default="", help="what else ran on the machine, kept in the JSON")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    result: dict[str, Any] = {
        "env": ENV, "tool": TOOL, "seconds": args.seconds, "note": args.note,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": []}
    farms = {k: Farm(k, warm=LEASES) for k in kinds}
    if args.baseline:
        farms["baseline"] = Farm(kinds[0], warm=LEASES, repo=args.baseline.resolve())
    awm = AWM(1)
    try:
        if args.profile:
            first = farms[kinds[0]]
            held = leases(first.url, LEASES)
            try:
                result["profile"] = profile_farm(first, held, args.profile)
            finally:
                release(first.url, held)
            for name, prof in result["profile"].items():
                print(f"profile {name} ({prof['samples']} samples):",
                      json.dumps(prof["stages"]), flush=True)
        for i in range(args.rounds):
            row: dict[str, Any] = {"awm": measure_awm(awm, args.seconds)}
            for kind, farm in farms.items():
                row[kind] = measure_farm(farm, args.seconds)
            if args.pin:
                row["awm+pinned"] = measure_awm(awm, args.seconds, pinned=True)
                for kind, farm in farms.items():
                    row[kind + "+pinned"] = measure_farm(farm, args.seconds, pinned=True)
            result["rounds"].append(row)
            print(f"round {i + 1}:", json.dumps({k: {m: (v[m].get("cpu_us_per_call"),
                                                         v[m]["req_per_s"], v[m]["p50_ms"])
                                                     for m in v} for k, v in row.items()}),
                  flush=True)
    finally:
        for farm in farms.values():
            farm.stop()
        awm.stop()
    result["summary"] = summarize(result["rounds"])
    print(json.dumps(result["summary"], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds, and each farm's CPU per call as a ratio of AWM's (same round)."""
    out: dict[str, Any] = {}
    for system in rounds[0]:
        for mode in rounds[0][system]:
            rows = [r[system][mode] for r in rounds]
            fig = {"req_per_s": statistics.median(x["req_per_s"] for x in rows),
                   "p50_ms": statistics.median(x["p50_ms"] for x in rows)}
            if "cpu_us_per_call" in rows[0]:
                fig["cpu_us_per_call"] = statistics.median(x["cpu_us_per_call"] for x in rows)
                fig["front_us_per_call"] = statistics.median(x["front_us_per_call"] for x in rows)
                if not system.startswith("awm"):
                    fig["cpu_vs_awm"] = round(statistics.median(
                        r[system][mode]["cpu_us_per_call"] / r["awm"]["http_32"]["cpu_us_per_call"]
                        for r in rounds), 3)
                    if system.endswith("+pinned"):
                        fig["cpu_vs_awm_pinned"] = round(statistics.median(
                            r[system][mode]["cpu_us_per_call"]
                            / r["awm+pinned"]["http_32"]["cpu_us_per_call"] for r in rounds), 3)
            out[f"{system}/{mode}"] = fig
    return out


if __name__ == "__main__":
    main()
