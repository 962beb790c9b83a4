"""Serve's own cost per request under HAProxy ingress, without the farm: replica CPU per request
of a trivial ASGI app (answers ``{}``) for Serve's logging settings and request headers, next to
the same app in a plain uvicorn process.

Each variant redeploys the app, then ``wrk`` sends 32 connections of POSTs; the figure is the
replica process's CPU seconds over the middle of the run divided by the requests
served: what one request costs Serve's replica, whatever else shares the machine. Variants run
interleaved, ``--rounds`` times.

Starts Ray: run it inside a private network namespace, e.g.
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python \
        benchmarks/serve/bench_serve_overhead.py'
Raw results: benchmarks/results/serve_overhead.json.
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

from benchmarks._procs import cores_while
from benchmarks.serve.bench_dataplane import free_port, wrk

OUT = REPO / "benchmarks" / "results" / "serve_overhead.json"
NO_DISCONNECT = {"x-request-disconnect-disabled": "?1"}  # what the envfarm SDK sends
#: name -> (the deployment's Serve logging_config, extra request headers).
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "serve_default": ({}, {}),  # INFO, access log on (Serve's default)
    "access_log_filtered": ({"enable_access_log": False}, {}),
    "warning": ({"enable_access_log": False, "log_level": "WARNING"}, {}),  # the farm's default
    "warning+sdk_header": ({"enable_access_log": False, "log_level": "WARNING"}, NO_DISCONNECT),
    "serve_default+sdk_header": ({}, NO_DISCONNECT),
}


async def trivial_app(scope: dict, receive: Any, send: Any) -> None:
    """The app under test: read the body, answer ``{}``."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


def replica_pid(title: str) -> int:
    """The newest process whose title is a Serve replica's (Ray sets ``ray::<actor>``)."""
    out = subprocess.run(["pgrep", "-n", "-f", title], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.split()[0])


def drive(url: str, pid: int, headers: dict[str, str], seconds: float) -> dict[str, float]:
    """wrk for ``seconds``; CPU of ``pid`` over all but its first and last second."""
    reqs = [("POST", "/t/x", {"Content-Type": "application/json", **headers}, "{}")]
    out, cores_by_pid = cores_while(lambda: wrk(url, reqs, 32, seconds), seconds)
    assert out["non_2xx"] == 0, out
    cores = cores_by_pid[pid][1]
    return {"req_per_s": out["req_per_s"], "cores": round(cores, 3),
            "us_per_req": round(cores / out["req_per_s"] * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    from envfarm.serve._ingress import use_ingress

    use_ingress("haproxy")  # the farm's ingress and its tuning, as `envfarm serve` runs it
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "1")
    import ray
    from ray import serve

    @serve.deployment
    @serve.ingress()
    class Trivial:
        def __serve_build_asgi_app__(self) -> Any:
            return trivial_app

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                logging_config={"log_level": "WARNING"})
    plain_port = free_port()
    plain = subprocess.Popen([sys.executable, "-m", "uvicorn",
                              "benchmarks.serve.bench_serve_overhead:trivial_app", "--port",
                              str(plain_port), "--log-level", "warning", "--no-access-log"],
                             cwd=REPO)
    res: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "load_avg_start": os.getloadavg()},
        "config": {"seconds": args.seconds, "conns": 32, "rounds": args.rounds,
                   "variants": {k: {"logging_config": v[0], "headers": v[1]}
                                for k, v in VARIANTS.items()}},
        "rounds": []}
    try:
        time.sleep(2)
        for r in range(args.rounds):
            row: dict[str, Any] = {}
            for name, (logging_config, headers) in VARIANTS.items():
                serve.run(Trivial.options(logging_config=logging_config).bind(), name="t",
                          route_prefix="/t")
                pid = replica_pid("ServeReplica:t:Trivial")
                time.sleep(1)
                row[name] = drive(f"http://127.0.0.1:{port}", pid, headers, args.seconds)
                serve.delete("t")
            row["plain_uvicorn"] = drive(f"http://127.0.0.1:{plain_port}", plain.pid, {},
                                         args.seconds)
            row["load_avg"] = os.getloadavg()
            res["rounds"].append(row)
            print(json.dumps({"round": r, **row}), flush=True)
    finally:
        plain.terminate()
        plain.wait(timeout=10)
        serve.shutdown()
        ray.shutdown()
    names = [*VARIANTS, "plain_uvicorn"]
    res["median_us_per_req"] = {n: statistics.median(r[n]["us_per_req"] for r in res["rounds"])
                                for n in names}
    print(json.dumps(res["median_us_per_req"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
