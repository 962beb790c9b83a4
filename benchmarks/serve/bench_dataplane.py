"""The farm's data plane, one tool call per request (issue 9): Serve on HAProxy ingress vs Serve
on its Python proxy vs the --no-ray process vs AWM's process-per-instance way, interleaved.

Throughput comes from ``wrk`` (a C load generator: the client must not cap the figure on a
2-core machine): 32 connections over 32 leases, each request one ``get_my_profile`` call (HTTP
``/call``, or MCP ``tools/call``). Latency at one connection from ``wrk --latency``; lease
acquire p50 from sequential create+release over one keep-alive connection.

Starts Ray: run it inside a private network namespace, e.g.
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/serve/bench_dataplane.py'
Raw results: benchmarks/results/dataplane.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks._procs import cores_while

PY = sys.executable
ENV = "hotel_booking_1"
TOOL = "get_my_profile"
LEASES = 32
#: Headers added to every call request (``--header``), e.g. Serve's disconnect opt-out.
EXTRA_HEADERS: dict[str, str] = {}
OUT = REPO / "benchmarks" / "results" / "dataplane.json"


def free_port() -> int:
    from envfarm.farm import free_port as fp

    return fp()


def wait_http(url: str, path: str, timeout_s: float = 240.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url}{path} did not come up")


# -- the systems under test ------------------------------------------------------------------
# The --no-ray process with ``fast_paths=False``: every request through FastAPI / FastMCP, as
# before the fast paths (envfarm.farm._fastpath), for a before/after ratio in one run.
_FRAMEWORKS_ONLY = (
    "import sys; from cluster.compose import compose_core; "
    "from envfarm.farm import FarmConfig, PoolConfig, make_server; "
    "c = FarmConfig(envs=[sys.argv[1]], pool=PoolConfig(warm=int(sys.argv[2])), "
    "fast_paths=False); make_server(compose_core(c), '127.0.0.1', int(sys.argv[3])).run()")


class Farm:
    """A farm in a subprocess: ``serve --proxy haproxy|python`` (``+flag`` adds ``--flag``,
    ``+flag=value`` adds ``--flag value``),
    ``serve --no-ray``, or ``frameworks`` (the --no-ray process without the fast paths)."""

    def __init__(self, kind: str, warm: int, repo: Path = REPO) -> None:
        """``repo``: the checkout whose code the farm runs (another one for a before/after)."""
        self.kind = kind
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [PY, "-m", "cluster.cli", "serve", "--envs", ENV, "--warm", str(warm),
                "--port", str(self.port)]
        # e.g. haproxy+access-log: `serve --access-log`; haproxy@NAME=VALUE: that env variable.
        kind, *assigns = kind.split("@")
        env = {**os.environ, **dict(a.split("=", 1) for a in assigns)}
        if repo != REPO:
            env["PYTHONPATH"] = str(repo)
        proxy, *flags = kind.split("+")
        # haproxy+replicas=2: `serve --replicas 2` (two pool replicas behind the Door)
        flags = [arg for f in flags for arg in (f"--{f.split('=')[0]}", *f.split("=")[1:2])]
        args += (["--no-ray", *flags] if proxy == "no-ray" else
                 ["--proxy", proxy, "--num-cpus", "2", *flags])
        if kind == "frameworks":
            args = [PY, "-c", _FRAMEWORKS_ONLY, ENV, str(warm), str(self.port)]
        t0 = time.perf_counter()
        self.log = tempfile.NamedTemporaryFile(prefix=f"dataplane-{kind}-", suffix=".log",
                                               delete=False)
        self.proc = subprocess.Popen(args, cwd=repo, start_new_session=True, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_http(self.url, f"/envs/{ENV}")
        except RuntimeError:
            self.stop()
            raise RuntimeError(f"{kind} farm did not come up; see {self.log.name}") from None
        self.start_s = time.perf_counter() - t0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the session this script started
            self.proc.wait()


class AWM:
    """AWM's way: one uvicorn process of the env's own code per instance, each with a DB file."""

    def __init__(self, n: int) -> None:
        from envfarm import EnvRuntime, load_catalog

        runtime = EnvRuntime(load_catalog()[ENV])
        self.op = runtime.operations[TOOL]
        self.tmp = Path(tempfile.mkdtemp(prefix="awm-dataplane-"))
        (self.tmp / "awm_env.py").write_text(runtime.bundle.code or "")
        self.procs: list[subprocess.Popen] = []
        self.urls: list[str] = []
        for i in range(n):
            db = self.tmp / f"inst{i}.db"
            db.write_bytes(runtime.template.data)
            port = free_port()
            env = {**os.environ, "DATABASE_PATH": f"sqlite:///{db}"}
            self.procs.append(subprocess.Popen(
                [PY, "-m", "uvicorn", "awm_env:app", "--host", "127.0.0.1", "--port",
                 str(port), "--log-level", "warning", "--no-access-log"], cwd=self.tmp, env=env))
            self.urls.append(f"http://127.0.0.1:{port}")
        for url in self.urls:
            wait_http(url, "/openapi.json")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- wrk -------------------------------------------------------------------------------------
def _lua(requests: list[tuple[str, str, dict[str, str], str]]) -> str:
    """A wrk script cycling through the given (method, path, headers, body) requests."""
    def q(s: str) -> str:
        return json.dumps(s)  # a JSON string is a valid Lua string literal here (ASCII)

    rows = []
    for method, path, headers, body in requests:
        hs = ", ".join(f"[{q(k)}] = {q(v)}" for k, v in headers.items())
        rows.append(f"{{{q(method)}, {q(path)}, {{{hs}}}, {q(body)}}}")
    return ("local reqs = {" + ",\n".join(rows) + "}\nlocal i = 0\n"
            "request = function()\n  i = i % #reqs + 1\n  local r = reqs[i]\n"
            "  return wrk.format(r[1], r[2], r[3], r[4])\nend\n")


def _ms(text: str) -> float | None:
    if not re.fullmatch(r"[\d.]+(us|ms|s|m)", text):
        return None
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def wrk(url: str, requests: list[tuple[str, str, dict[str, str], str]], conns: int,
        seconds: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(_lua(requests))
    try:
        out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--latency",
                              "-s", f.name, url], capture_output=True, text=True,
                             check=True, timeout=seconds + 60).stdout
    finally:
        os.unlink(f.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    # The distribution's own lines ("     50%  1.2ms"), not a "+/- Stdev" figure ending in 50%.
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    if p50 is None or p99 is None:
        print("wrk output not understood:\n" + out, file=sys.stderr)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    sock = re.search(r"Socket errors: (.*)", out)
    return {"conns": conns, "req_per_s": rps,
            "p50_ms": p50 and round(p50, 3), "p99_ms": p99 and round(p99, 3),
            "non_2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": sock.group(1) if sock else None}


def wrk_with_cpu(url: str, requests: list[tuple[str, str, dict[str, str], str]], conns: int,
                 seconds: float) -> dict[str, Any]:
    """``wrk``, plus the busiest processes' CPU (cores, and µs per request) over all but the
    run's first and last second: where each request's CPU goes; and the machine's CPU per
    request, every process but wrk (what serving one request costs the node)."""
    out, cores = cores_while(lambda: wrk(url, requests, conns, seconds), seconds)
    busy = sorted(((c, cmd) for cmd, c in cores.values() if c > 0.005), reverse=True)
    cpu = [{"cmd": cmd, "cores": round(c, 3), "us_per_req": round(c / out["req_per_s"] * 1e6, 1)}
           for c, cmd in busy]
    served = sum(c for c, cmd in busy if not cmd.startswith("wrk "))
    return {**out, "cpu": cpu[:8], "cores_but_wrk": round(served, 3),
            "us_per_req_but_wrk": round(served / out["req_per_s"] * 1e6, 1)}


# -- measurements ----------------------------------------------------------------------------
def leases(url: str, n: int) -> list[dict]:
    import httpx

    with httpx.Client(base_url=url, timeout=60) as c:
        out = []
        for _ in range(n):
            r = c.post(f"/envs/{ENV}/leases", json={})
            r.raise_for_status()
            out.append(r.json())
        return out


def release(url: str, held: list[dict]) -> None:
    import httpx

    with httpx.Client(base_url=url, timeout=60) as c:
        for le in held:
            c.delete(f"/envs/{ENV}/leases/{le['lease_id']}",
                     headers={"Authorization": f"Bearer {le['token']}"})


def call_requests(held: list[dict], mcp: bool) -> list[tuple[str, str, dict[str, str], str]]:
    out = []
    for le in held:
        headers = {"Authorization": f"Bearer {le['token']}", "Content-Type": "application/json",
                   **EXTRA_HEADERS}
        if mcp:
            headers["Accept"] = "application/json, text/event-stream"
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": TOOL, "arguments": {}}}
            out.append(("POST", urlsplit(le["mcp_url"]).path, headers, json.dumps(body)))
        else:
            out.append(("POST", f"/envs/{ENV}/leases/{le['lease_id']}/call", headers,
                        json.dumps({"tool": TOOL, "arguments": {}})))
    return out


def check_calls(url: str, held: list[dict]) -> None:
    """Every lease answers both ways before wrk drives it (wrk checks only status codes)."""
    import httpx

    with httpx.Client(base_url=url, timeout=60) as c:
        for method, path, headers, body in (call_requests(held, False)
                                            + call_requests(held, True)):
            r = c.request(method, path, headers=headers, content=body)
            data = r.json()
            ok = data.get("ok") if "jsonrpc" not in data else not data["result"].get("isError")
            if r.status_code != 200 or not ok:
                raise RuntimeError(f"{path}: {r.status_code} {r.text[:300]}")


def acquire_p50(url: str, n: int) -> dict[str, float]:
    """Sequential lease create (timed) + release over one keep-alive connection."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("POST", f"/envs/{ENV}/leases", body=b"{}",
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        info = json.loads(r.read())
        lat.append(time.perf_counter() - t0)
        if r.status != 201:
            raise RuntimeError(f"lease: {r.status} {info}")
        conn.request("DELETE", f"/envs/{ENV}/leases/{info['lease_id']}",
                     headers={"Authorization": f"Bearer {info['token']}"})
        conn.getresponse().read()
    conn.close()
    lat.sort()
    return {"n": n, "p50_ms": round(lat[n // 2] * 1000, 3),
            "p99_ms": round(lat[min(n - 1, int(n * 0.99))] * 1000, 3)}


def measure_farm(farm: Farm, seconds: float) -> dict[str, Any]:
    held = leases(farm.url, LEASES)
    try:
        check_calls(farm.url, held)
        res = {
            "http_32": wrk_with_cpu(farm.url, call_requests(held, False), LEASES, seconds),
            "mcp_32": wrk(farm.url, call_requests(held, True), LEASES, seconds),
            "http_1": wrk(farm.url, call_requests(held[:1], False), 1, seconds),
        }
    finally:
        release(farm.url, held)
    res["acquire"] = acquire_p50(farm.url, 200)
    return res


def measure_awm(awm: AWM, seconds: float) -> dict[str, Any]:
    """AWM has no leases: a call is its REST route; one wrk per process, 32 connections total."""
    per = max(1, LEASES // len(awm.urls))
    req = [(awm.op.method.upper(), awm.op.path, {}, "")]
    procs = []
    for url in awm.urls:
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
            f.write(_lua(req))
        procs.append((f.name, subprocess.Popen(
            ["wrk", "-t1", f"-c{per}", f"-d{seconds:g}s", "--latency", "-s", f.name, url],
            stdout=subprocess.PIPE, text=True)))
    rps, non2xx = 0.0, 0
    for name, p in procs:
        out, _ = p.communicate(timeout=seconds + 60)
        os.unlink(name)
        rps += float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore
        m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
        non2xx += int(m.group(1)) if m else 0
    one = wrk(awm.urls[0], req, 1, seconds)
    return {"http_32": {"conns": per * len(awm.urls), "req_per_s": round(rps, 2),
                        "non_2xx": non2xx}, "http_1": one}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="wrk duration per figure")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds")
    ap.add_argument("--note", default="", help="what else ran on the machine, kept in the JSON")
    ap.add_argument("--awm", type=int, default=4, help="AWM processes")
    ap.add_argument("--out", type=Path, default=OUT, help="where the raw JSON goes")
    ap.add_argument("--modes", default="haproxy,python", help="Serve ingress modes to run, "
                    "comma-separated; `haproxy+access-log` adds `serve --access-log`, "
                    "`haproxy@NAME=VALUE` sets an environment variable for that farm (empty: "
                    "only the --no-ray process, with and without the fast paths)")
    ap.add_argument("--header", action="append", default=[], metavar="NAME:VALUE",
                    help="add a header to every call request (repeatable)")
    args = ap.parse_args()
    EXTRA_HEADERS.update(h.split(":", 1) for h in args.header)
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install -y wrk)")
    res: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_start": os.getloadavg(), "note": args.note,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
        "config": {"env": ENV, "tool": TOOL, "leases": LEASES, "seconds": args.seconds,
                   "extra_headers": EXTRA_HEADERS,
                   "rounds": args.rounds, "awm_processes": args.awm},
        "rounds": []}
    no_ray = Farm("no-ray", warm=LEASES + 8)
    frameworks = Farm("frameworks", warm=LEASES + 8)
    awm = AWM(args.awm)
    try:
        for r in range(args.rounds):
            for mode in [m for m in args.modes.split(",") if m] or [None]:
                farm = Farm(mode, warm=LEASES + 8) if mode else None
                try:
                    row: dict[str, Any] = {"round": r, "mode": mode}
                    if farm is not None:
                        row["serve_start_s"] = round(farm.start_s, 1)
                        row["serve"] = measure_farm(farm, args.seconds)
                    row["no_ray"] = measure_farm(no_ray, args.seconds)
                    row["no_ray_frameworks_only"] = measure_farm(frameworks, args.seconds)
                    row["awm"] = measure_awm(awm, args.seconds)
                    row["load_avg"] = os.getloadavg()
                finally:
                    if farm is not None:
                        farm.stop()
                res["rounds"].append(row)
                print(json.dumps(row), flush=True)
    finally:
        no_ray.stop()
        frameworks.stop()
        awm.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
