"""The trust boundary's price (issue 20): env code in jailed worker processes vs in the serving
process, side by side in one run, on the same env, tool, client and cores.

Per round and per farm kind (Serve on HAProxy, and the --no-ray process; each with workers, the
default, and with ``--in-process``): one-call-per-request HTTP and MCP throughput (wrk, 32
connections over 32 leases), one-connection latency, lease acquire p50. Once per isolation: the
PSS of every process of a --no-ray farm holding 1,024 leases (each called once, so each
instance exists), and ``Instance.reset`` timed inside a jailed process (a worker's code path).

Starts Ray: run it inside a private network namespace, e.g.
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/boundary/bench_boundary.py'
Raw results: benchmarks/results/boundary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.serve.bench_dataplane import ENV, Farm, measure_farm  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "boundary.json"
LEASES_FOR_MEMORY = 1024

_RESET_IN_JAIL = """
import json, sys, time
from envfarm.catalog import load_catalog
from envfarm.jail import JailPolicy, enter
from envfarm.runtime import EnvRuntime
bundle = load_catalog()[sys.argv[1]]
enter(JailPolicy(memory_mb=2048), keep_fds=(0, 1, 2))  # as a worker: jail first, then the code
inst = EnvRuntime(bundle).instance()
lat = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    inst.reset()
    lat.append(time.perf_counter() - t0)
lat.sort()
print(json.dumps({"n": len(lat), "p50_us": round(lat[len(lat) // 2] * 1e6, 1),
                  "p99_us": round(lat[int(len(lat) * 0.99)] * 1e6, 1)}))
"""


def reset_in_jail(n: int = 3000) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _RESET_IN_JAIL, ENV, str(n)], cwd=REPO,
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def pss_mib(pid: int) -> dict[str, float]:
    """PSS of ``pid`` and every descendant, by role (front, env workers, other)."""
    import psutil

    roles: dict[str, float] = {}
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            text = Path(f"/proc/{proc.pid}/smaps_rollup").read_text()
            pss = next(int(line.split()[1]) for line in text.splitlines()
                       if line.startswith("Pss:")) / 1024
            cmd = " ".join(proc.cmdline())
        except (OSError, StopIteration, psutil.Error):
            continue
        role = "front" if proc.pid == pid else ("env workers" if "envfarm.worker" in cmd
                                                 else "other")
        roles[role] = round(roles.get(role, 0.0) + pss, 1)
    roles["total"] = round(sum(roles.values()), 1)
    return roles


def memory_with_leases(kind: str, n: int) -> dict[str, Any]:
    import httpx

    farm = Farm(kind, warm=8)
    try:
        before = pss_mib(farm.proc.pid)
        t0 = time.perf_counter()
        with httpx.Client(base_url=farm.url, timeout=300) as c:
            held = []
            while len(held) < n:
                r = c.post(f"/envs/{ENV}/leases:batch", json={"count": min(256, n - len(held))})
                r.raise_for_status()
                held += r.json()
            lease_s = time.perf_counter() - t0
            for le in held:  # each instance is made on its first use
                r = c.post(f"/envs/{ENV}/leases/{le['lease_id']}/call",
                           headers={"Authorization": f"Bearer {le['token']}"},
                           json={"tool": "get_my_profile", "arguments": {}})
                assert r.status_code == 200 and r.json()["ok"], r.text
        after = pss_mib(farm.proc.pid)
        workers = httpx.get(farm.url + f"/envs/{ENV}").json()["pool"].get("workers")
    finally:
        farm.stop()
    return {"leases": n, "lease_all_s": round(lease_s, 1), "pss_mib_idle": before,
            "pss_mib_with_leases": after, "workers": workers,
            "mib_per_lease": round((after["total"] - before["total"]) / n, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="wrk duration per figure")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    ap.add_argument("--kinds", default="haproxy,no-ray",
                    help="farm kinds, each run with workers and with +in-process")
    ap.add_argument("--note", default="", help="what else ran on the machine")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    res: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_start": os.getloadavg(), "note": args.note,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
        "rounds": []}
    res["reset_in_jail"] = reset_in_jail()
    print(json.dumps({"reset_in_jail": res["reset_in_jail"]}), flush=True)
    for r in range(args.rounds):
        for kind in args.kinds.split(","):
            row: dict[str, Any] = {"round": r, "kind": kind}
            for isolation, variant in (("workers", kind), ("in_process", kind + "+in-process")):
                farm = Farm(variant, warm=40)
                try:
                    row[isolation] = {"start_s": round(farm.start_s, 1),
                                      **measure_farm(farm, args.seconds)}
                finally:
                    farm.stop()
            w, i = row["workers"], row["in_process"]
            row["ratio_http"] = round(w["http_32"]["req_per_s"] / i["http_32"]["req_per_s"], 3)
            row["ratio_mcp"] = round(w["mcp_32"]["req_per_s"] / i["mcp_32"]["req_per_s"], 3)
            row["load_avg"] = os.getloadavg()
            res["rounds"].append(row)
            print(json.dumps({k: row[k] for k in ("round", "kind", "ratio_http", "ratio_mcp")}
                             | {"http_workers": w["http_32"]["req_per_s"],
                                "http_in_process": i["http_32"]["req_per_s"],
                                "acquire_p50_ms": w["acquire"]["p50_ms"]}), flush=True)
    for isolation, variant in (("workers", "no-ray"), ("in_process", "no-ray+in-process")):
        res[f"memory_{isolation}"] = memory_with_leases(variant, LEASES_FOR_MEMORY)
        print(json.dumps({isolation: res[f"memory_{isolation}"]}), flush=True)
    for kind in args.kinds.split(","):
        rows = [row for row in res["rounds"] if row["kind"] == kind]
        res[f"median_ratio_http_{kind}"] = statistics.median(r["ratio_http"] for r in rows)
        res[f"median_ratio_mcp_{kind}"] = statistics.median(r["ratio_mcp"] for r in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
