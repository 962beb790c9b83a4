"""The Serve hop under many leases: N leases over 2 pool replicas behind the Door against the same
N leases on the ``--no-ray`` farm, in one run, phases interleaved.

Both farms start once and hold N leases each (every lease writes its own state, then reads it
back call after call, one call per HTTP request, each lease its own connection: the soak's
traffic, benchmarks/load/soak.py). Each round runs a phase per mode for ``--seconds``: the
``--no-ray`` farm, then Serve with the Door's direct hop (``http``), then with the handle hop
(``handle``, switched at run time by ``Door.hop``), and ``serve_direct``: the client sends each
lease's calls to its owner's listener itself (``LeaseInfo.direct_url``, what
``Farm(direct=True)`` does), past HAProxy and the Door. Per phase: calls/s, p50/p99, errors, and the
CPU seconds of each farm's processes by group, per call. Medians over rounds, and ratios to the
``--no-ray`` phase of the same round. Optional py-spy of the Door and a pool replica.

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/serve/bench_serve_hop.py'
Raw results: benchmarks/results/serve_hop.json.
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
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks._procs import ray_group  # noqa: E402
from benchmarks.load.bench_farm_load import ENV, auth  # noqa: E402
from benchmarks.trainer.bench_rollout import start_no_ray  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "serve_hop.json"
READ = {"tool": "list_wishlists"}


def group_of(cmd: str, name: str) -> str:
    """A farm process's group (env code and verifiers by module, Serve's by actor)."""
    if "envfarm.confined" in cmd or "_sandbox_worker" in cmd:
        return "env workers"
    return ray_group(cmd, name)


def cpu_by_group(root: int, skip: set[int]) -> dict[str, float]:
    """CPU seconds (user + system, ended children included) of ``root``'s descendants, by
    group, leaving out the trees under the pids in ``skip``."""
    import psutil

    out: dict[str, float] = defaultdict(float)
    top = psutil.Process(root)
    skipped = set(skip)
    for pid in skip:
        try:
            skipped |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pass
    for proc in top.children(recursive=True):
        if proc.pid in skipped:
            continue
        try:
            t, cmd, name = proc.cpu_times(), " ".join(proc.cmdline()), proc.name()
        except psutil.Error:
            continue
        out[group_of(cmd, name)] += t.user + t.system + t.children_user + t.children_system
    return dict(out)


def tree_by_group(pid: int) -> dict[str, float]:
    """The ``--no-ray`` farm: its front (the root) and its env workers and verifiers."""
    import psutil

    root = psutil.Process(pid)
    t = root.cpu_times()
    out = {"front": t.user + t.system + t.children_user + t.children_system}
    out["env workers"] = 0.0
    for proc in root.children(recursive=True):
        try:
            c = proc.cpu_times()
        except psutil.Error:
            continue
        out["env workers"] += c.user + c.system + c.children_user + c.children_system
    return out


class Leases:
    """N leases on one farm, each with its own connection, and the traffic over them."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.n = url, n
        self.infos: list[dict] = []
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.n + 8),
            timeout=aiohttp.ClientTimeout(total=120))
        sem = asyncio.Semaphore(64)

        async def one() -> dict:
            async with sem:
                while True:
                    async with self.session.post(f"{self.url}/envs/{ENV}/leases",
                                                 json={"ttl_s": 7200}) as r:
                        if r.status != 201:
                            await asyncio.sleep(0.5)
                            continue
                        info = await r.json()
                    body = {"tool": "create_wishlist", "arguments": {"name": info["lease_id"]}}
                    async with self.session.post(self._call(info), json=body,
                                                 headers=auth(info)) as w:
                        if w.status == 200:
                            return info

        self.infos = list(await asyncio.gather(*(one() for _ in range(self.n))))

    def _call(self, info: dict, direct: bool = False) -> str:
        base = info["direct_url"] if direct else self.url
        return f"{base}/envs/{ENV}/leases/{info['lease_id']}/call"

    async def phase(self, seconds: float, direct: bool = False) -> dict[str, Any]:
        """Every lease calls back to back for ``seconds`` (``direct``: to its owner's listener):
        calls/s, latency, errors."""
        stop = time.monotonic() + seconds
        lat: list[float] = []
        errors: Counter = Counter()
        calls = 0

        async def loop(info: dict) -> None:
            nonlocal calls
            url, headers = self._call(info, direct), auth(info)
            while (t := time.monotonic()) < stop:
                try:
                    async with self.session.post(url, json=READ, headers=headers) as r:
                        await r.read()
                        status = r.status
                except (TimeoutError, aiohttp.ClientError) as exc:
                    errors[type(exc).__name__] += 1
                    continue
                calls += 1
                lat.append(time.monotonic() - t)
                if status != 200:
                    errors[str(status)] += 1

        t0 = time.monotonic()
        await asyncio.gather(*(loop(i) for i in self.infos))
        wall = time.monotonic() - t0
        lat.sort()
        return {"calls": calls, "calls_per_s": round(calls / wall, 1),
                "p50_ms": round(lat[len(lat) // 2] * 1000, 1) if lat else None,
                "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 1) if lat else None,
                "errors": dict(errors), "wall_s": round(wall, 1)}

    async def close(self) -> None:
        async def release(info: dict) -> None:
            async with self.session.delete(f"{self.url}/envs/{ENV}/leases/{info['lease_id']}",
                                           headers=auth(info)) as r:
                await r.read()

        await asyncio.gather(*(release(i) for i in self.infos), return_exceptions=True)
        await self.session.close()


def py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    exe = str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen([exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100",
                             "-f", "raw", "-o", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def replica_pids() -> dict[str, int]:
    import psutil

    out = {}
    for proc in psutil.process_iter():
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        for role in ("door", "pool"):
            if f"ServeReplica:env-{ENV}:{role}" in cmd and os.getpid() in {
                    p.pid for p in proc.parents()}:
                out.setdefault(role, proc.pid)
    return out


async def run(args: argparse.Namespace, no_ray_url: str, no_ray_pid: int, serve_url: str
              ) -> dict[str, Any]:
    from ray import serve

    door = serve.get_deployment_handle("door", app_name=f"env-{ENV}")
    farms = {"no_ray": Leases(no_ray_url, args.leases), "serve": Leases(serve_url, args.leases)}
    t0 = time.monotonic()
    for f in farms.values():
        await f.open()
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"acquire_s": round(time.monotonic() - t0, 1), "rounds": rows}
    modes = args.modes.split(",")
    try:
        for rnd in range(args.rounds):
            row: dict[str, Any] = {"load_avg": os.getloadavg()}
            for mode in modes:
                farm = farms["no_ray" if mode == "no_ray" else "serve"]
                if mode != "no_ray":  # the direct client: the Door's listeners stay in use
                    await door.hop.remote("http" if mode == "serve_direct"
                                          else mode.removeprefix("serve_"))

                def cpu() -> dict[str, float]:
                    return (tree_by_group(no_ray_pid) if mode == "no_ray"
                            else cpu_by_group(os.getpid(), {no_ray_pid}))

                spy = []
                if args.profile and rnd == 0 and mode != "no_ray":
                    pids = replica_pids()
                    spy = [py_spy(pids[r], args.seconds - 2, args.profile / f"{mode}-{r}.txt")
                           for r in ("door", "pool") if r in pids]
                c0 = cpu()
                res = await farm.phase(args.seconds, direct=mode == "serve_direct")
                c1 = cpu()
                for p in spy:
                    p.wait()
                by_group = {g: round(c1.get(g, 0) - c0.get(g, 0), 2) for g in c1}
                res["cpu_s_by_group"] = by_group
                res["cpu_us_per_call"] = round(sum(by_group.values()) / max(res["calls"], 1)
                                               * 1e6, 1)
                row[mode] = res
                print(f"round {rnd + 1} {mode}: {json.dumps(res)}", flush=True)
            rows.append(row)
    finally:
        for f in farms.values():
            await f.close()
    return out


def summarize(rows: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in modes:
        per = [r[mode] for r in rows]
        fig = {k: statistics.median(p[k] for p in per) for k in ("calls_per_s", "cpu_us_per_call")}
        fig["p50_ms"] = statistics.median(p["p50_ms"] for p in per if p["p50_ms"] is not None)
        if mode != "no_ray":
            fig["calls_per_s_vs_no_ray"] = round(statistics.median(
                r[mode]["calls_per_s"] / r["no_ray"]["calls_per_s"] for r in rows), 3)
            fig["cpu_per_call_vs_no_ray"] = round(statistics.median(
                r[mode]["cpu_us_per_call"] / r["no_ray"]["cpu_us_per_call"] for r in rows), 3)
        out[mode] = fig
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leases", type=int, default=1024)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0, help="traffic per phase")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="no_ray,serve_direct,serve_http,serve_handle")
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR",
                    help="py-spy the Door and a pool replica in round 1 (raw stacks to DIR)")
    ap.add_argument("--note", default="", help="what else ran on the machine")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    from cluster.serve import DeploymentOptions, ServeOptions, start_farm
    from envfarm.farm import FarmConfig, PoolConfig, free_port

    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "settings": vars(args) | {"profile": str(args.profile), "out": str(args.out),
                                  "env": ENV, "tool": READ["tool"]},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_start": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    proc, no_ray_url = start_no_ray(8, 2)
    farm = None
    try:
        farm = start_farm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=8)),
                          ServeOptions(port=free_port(), num_cpus=2, deployment=DeploymentOptions(
                              num_replicas=args.replicas)))
        result.update(asyncio.run(run(args, no_ray_url, proc.pid, farm.url)))
    finally:
        if farm is not None:
            farm.shutdown()
        proc.terminate()
        proc.wait(timeout=30)
    result["machine"]["load_avg_end"] = os.getloadavg()
    result["summary"] = summarize(result["rounds"], args.modes.split(","))
    print(json.dumps(result["summary"], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
