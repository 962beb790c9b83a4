"""Rollout throughput against the farm: 1,024 scripted episodes (ScriptedPolicy replays each
task's reference solution through the real agent loop: zero model cost) per run.

Paths, side by side in one run:
  no_ray          the farm in one uvicorn process (a subprocess), SDK over HTTP, one call/request
  serve_http      the Ray Serve farm over HTTP, one call per request
  serve_batched   the Serve farm over HTTP, GRPO groups leased with one `leases:batch` request
                  and concurrent episodes' tool calls coalesced into one owner-batch request
  serve_handles   the same, but calls and leases go over DeploymentHandles (in-cluster)
  no_ray_bare, serve_bare
                  the client doing only what AWM's baseline does: replay the calls, verify (no
                  agent loop, policy or format checks), one lease per episode
  awm             AWM's way: one uvicorn process + SQLite file per instance, as many as fit,
                  reset by file copy, verifier exec'd in the client process; started once
                  and run in every round beside the farm's modes (vs_awm_by_round)
Reports episodes/s, the CPU seconds of the client and of the farm's (or AWM's) processes, env calls/s (list_tools + tool calls + verify), farm requests/s, and the
share of episode time spent waiting on the farm. Raw JSON goes to benchmarks/results/.

Starts Ray: run it inside a private network namespace, e.g.
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/trainer/bench_rollout.py'
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
PY = sys.executable

from envfarm import EnvRuntime, load_catalog  # noqa: E402
from envfarm.client import AiohttpTransport, Farm, HttpxTransport  # noqa: E402
from trainer.episode import EpisodeResult, run_episode  # noqa: E402
from trainer.policy import ScriptedPolicy  # noqa: E402

from benchmarks._procs import ray_group, wait_http  # noqa: E402
from benchmarks.trainer._transports import CoalescingTransport, HandleTransport  # noqa: E402

GROUP = 8  # G: rollouts per task, leased together on the batched paths


# -- the rollouts -------------------------------------------------------------------------------
def make_jobs(catalog: Any, episodes: int) -> list[tuple[str, int]]:
    """GRPO-shaped work: groups of G episodes on one task, cycling over every solved task."""
    tasks = [(env, idx) for env in catalog.servable for idx in sorted(catalog[env].solutions)]
    groups = episodes // GROUP
    return [tasks[g % len(tasks)] for g in range(groups)]


async def rollouts(farm: Farm, policy: ScriptedPolicy, groups: list[tuple[str, int]],
                   concurrency: int, batched_leases: bool) -> tuple[list[EpisodeResult], float]:
    """Every group's G episodes, at most ``concurrency`` episodes in flight."""
    sem = asyncio.Semaphore(max(1, concurrency // GROUP))

    async def group(env: str, idx: int) -> list[EpisodeResult]:
        async with sem:
            if batched_leases:
                leases = await farm.acquire_many(env, GROUP, task_idx=idx)
                return await asyncio.gather(*(run_episode(farm, policy, env, idx, lease=le)
                                              for le in leases))
            return await asyncio.gather(*(run_episode(farm, policy, env, idx)
                                          for _ in range(GROUP)))

    t0 = time.perf_counter()
    out = await asyncio.gather(*(group(env, idx) for env, idx in groups))
    return [r for g in out for r in g], time.perf_counter() - t0


async def bare_rollouts(farm: Farm, catalog: Any, groups: list[tuple[str, int]],
                        concurrency: int) -> tuple[dict, float]:
    """The same episodes with the client's work AWM's baseline does (``awm_rollouts``): replay
    the reference calls and verify, no agent loop, policy or format checks; the farm's side
    is unchanged (lease, tool list, calls, verify, release over HTTP)."""
    sem = asyncio.Semaphore(max(1, concurrency))
    stats = {"ok": 0, "calls": 0, "invalid": 0}

    async def episode(env: str, idx: int) -> None:
        async with sem, farm.lease(env, task_idx=idx) as lease:
            await lease.tools()
            for call in catalog[env].solutions[idx]:
                await lease.call_result(call.tool, call.arguments)
            verdict = await lease.verify(idx, "The task is done.")
        stats["calls"] += len(catalog[env].solutions[idx]) + 2
        stats["ok"] += (verdict.reward or 0) > 0
        stats["invalid"] += not verdict.valid

    t0 = time.perf_counter()
    await asyncio.gather(*(episode(env, idx) for env, idx in groups for _ in range(GROUP)))
    return stats, time.perf_counter() - t0


def summarize(results: list[EpisodeResult], wall: float, **extra: Any) -> dict:
    env_calls = sum(r.env_calls for r in results)
    requests = env_calls + 2 * len(results)  # + lease + release
    shares = [r.env_seconds / r.seconds for r in results if r.seconds > 0]
    return {"episodes": len(results), "seconds": round(wall, 2),
            "episodes_per_s": round(len(results) / wall, 1),
            "env_calls_per_s": round(env_calls / wall, 1),
            "farm_requests_per_s": round(requests / wall, 1),
            "env_calls_per_episode": round(env_calls / len(results), 2),
            "success_rate": round(sum(r.success for r in results) / len(results), 4),
            "invalid": sum(not r.valid for r in results),
            "invalid_reasons": dict(Counter(f"{r.end.value}: {r.reason[:80]}"
                                            for r in results if not r.valid).most_common(3)),
            "farm_wait_share": round(statistics.mean(shares), 3) if shares else None,
            "episode_p50_ms": round(statistics.median(r.seconds for r in results) * 1000, 1),
            **extra}


def run_mode(*args: Any, **kw: Any) -> dict:
    """One timed run; a failure is recorded (with its error), not fatal to the other paths."""
    try:
        return _run_mode(*args, **kw)
    except Exception as exc:  # noqa: BLE001  (a benchmark reports, it does not stop)
        return {"error": f"{type(exc).__name__}: {exc}"[:500], "episodes_per_s": 0.0,
                "seconds": None}


def tree_cpu(pid: int, skip_self: bool = False) -> dict[str, float]:
    """CPU seconds (user + system) of ``pid`` and every process below it, by role (the root,
    env workers, the verifier sandbox, the rest), and of the ended ones each role reaped (a
    verifier's fresh child counts to the sandbox that waited on it)."""
    import psutil

    root = psutil.Process(pid)
    out: dict[str, float] = defaultdict(float)
    for proc in [root, *root.children(recursive=True)]:
        try:
            t, cmd = proc.cpu_times(), " ".join(proc.cmdline())
        except psutil.Error:
            continue
        role = ("root" if proc is root else "env workers" if "envfarm.confined" in cmd
                else "verifier sandbox" if "_sandbox_worker" in cmd
                else ray_group(cmd, proc.name()))
        own = 0.0 if (skip_self and proc is root) else t.user + t.system
        out[role] += own
        # processes that ended and were reaped: an env worker retired by the root counts here
        out["ended, reaped by " + role] += t.children_user + t.children_system
    return out


def serve_cpu(skip: int | None) -> dict[str, float]:
    """This process's descendants (Ray's, for a Serve farm) less the tree under ``skip``."""
    mine = tree_cpu(os.getpid(), True)
    if skip is None:
        return mine
    other = tree_cpu(skip)
    return {k: v - other.get(k, 0.0) for k, v in mine.items()}


def _run_mode(url: str, policy: ScriptedPolicy, groups: list, concurrency: int, transport: str,
             batched: bool, profile: bool = False, incluster: bool = False,
             bare: Any = None, farm_cpu: Any = None) -> dict:
    """One run; ``bare``: the catalog, to drive the episodes as ``bare_rollouts`` does;
    ``farm_cpu``: a function giving the farm's processes' CPU seconds so far."""
    async def go() -> dict:
        inner = (AiohttpTransport(url, max_connections=concurrency * 2) if transport == "aiohttp"
                 else HttpxTransport(url, max_connections=concurrency * 2))
        t: Any = inner
        if incluster:
            from cluster.serve import InClusterFarm

            t = HandleTransport(inner, await InClusterFarm.connect())
        elif batched:
            t = CoalescingTransport(inner)
        async with Farm(url, transport=t) as farm:
            # warm-up: one wave at full concurrency, so the farm has started the workers the
            # load needs, as AWM's processes are all started before its run
            wave = groups[:max(4, concurrency // GROUP)]
            if bare is not None:
                await bare_rollouts(farm, bare, wave, concurrency)
            else:
                await rollouts(farm, policy, wave, concurrency, batched)
            prof = cProfile.Profile() if profile else None
            if prof:
                prof.enable()
            cpu0, farm0 = time.process_time(), farm_cpu() if farm_cpu else {}
            if bare is not None:
                stats, wall = await bare_rollouts(farm, bare, groups, concurrency)
            else:
                results, wall = await rollouts(farm, policy, groups, concurrency, batched)
            cpu = time.process_time() - cpu0
            extra: dict[str, Any] = {"client_cpu_s": round(cpu, 2), "transport": transport,
                                     "concurrency": concurrency}
            if farm_cpu:
                farm1 = farm_cpu()
                by_role = {k: round(v - farm0.get(k, 0.0), 2) for k, v in farm1.items()}
                extra["farm_cpu_s"] = round(sum(by_role.values()), 2)
                extra["farm_cpu_by_role_s"] = by_role
            if isinstance(t, CoalescingTransport) and t.batches:
                extra["calls_per_batch"] = round(t.calls / t.batches, 1)
            if prof:
                prof.disable()
                extra["profile_top"] = top_functions(prof)
            if bare is not None:
                n = len(groups) * GROUP
                return {"episodes": n, "seconds": round(wall, 2),
                        "episodes_per_s": round(n / wall, 1),
                        "env_calls_per_s": round(stats["calls"] / wall, 1),
                        "success_rate": round(stats["ok"] / n, 4),
                        "invalid": stats["invalid"], **extra}
            return summarize(results, wall, **extra)

    return asyncio.run(go())


def top_functions(prof: cProfile.Profile, n: int = 25) -> list[str]:
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(n)
    return [line for line in buf.getvalue().splitlines() if line.strip()][-n:]


# -- the farms ----------------------------------------------------------------------------------
def start_no_ray(warm: int, verifier_workers: int, root: Path = REPO
                 ) -> tuple[subprocess.Popen, str]:
    """The ``--no-ray`` farm in a subprocess; ``root``: the tree it imports envfarm from."""
    from envfarm.farm import free_port

    port = free_port()
    code = ("from cluster.compose import compose_core\n"
            "from envfarm.farm import FarmConfig, PoolConfig, make_server\n"
            f"core = compose_core(FarmConfig(pool=PoolConfig(warm={warm}), "
            f"verifier_workers={verifier_workers}))\n"
            f"make_server(core, '127.0.0.1', {port}).run()\n")
    proc = subprocess.Popen([PY, "-c", code], cwd=root)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz")
    return proc, url


# -- AWM's way ----------------------------------------------------------------------------------
def start_awm(catalog: Any, per_env: int) -> tuple[dict, list[subprocess.Popen], Path]:
    """``per_env`` uvicorn processes of each env's own code, each with its own SQLite file."""
    from envfarm.farm import free_port

    tmp = Path(tempfile.mkdtemp(prefix="awm-rollout-"))
    instances: dict[str, list[dict]] = {}
    procs = []
    for env in catalog.servable:
        runtime = EnvRuntime(catalog[env])
        (tmp / f"{env}.py").write_text(runtime.bundle.code or "")
        template = tmp / f"{env}.template.db"
        template.write_bytes(runtime.template.data)
        instances[env] = []
        for i in range(per_env):
            db = tmp / f"{env}.{i}.db"
            shutil.copyfile(template, db)
            port = free_port()
            procs.append(subprocess.Popen(
                [PY, "-m", "uvicorn", f"{env}:app", "--host", "127.0.0.1", "--port", str(port),
                 "--log-level", "warning", "--no-access-log"], cwd=tmp,
                env={**os.environ, "DATABASE_PATH": f"sqlite:///{db}"}))
            instances[env].append({"url": f"http://127.0.0.1:{port}", "db": db,
                                   "template": template, "runtime": runtime})
    for insts in instances.values():
        for inst in insts:
            wait_http(inst["url"] + "/openapi.json")
    return instances, procs, tmp


def awm_verifiers(catalog: Any) -> dict[tuple[str, int], Any]:
    """AWM exec's verifier code in the trainer's process; so does this baseline (bundled code)."""
    out = {}
    for env in catalog.servable:
        for idx, ver in catalog[env].code_verifiers.items():
            scope: dict[str, Any] = {}
            exec(compile(ver.code, f"<verifier {env}:{idx}>", "exec"), scope)  # noqa: S102
            out[(env, idx)] = scope["verify_task_completion"]
    return out


async def awm_rollouts(catalog: Any, instances: dict, groups: list, verifiers: dict) -> dict:
    solutions = {(env, idx): catalog[env].solutions[idx] for env, idx in set(groups)}
    queues: dict[str, asyncio.Queue] = {}
    for env, insts in instances.items():
        queues[env] = asyncio.Queue()
        for inst in insts:
            queues[env].put_nowait(inst)
    stats = {"calls": 0, "wait": 0.0, "busy": 0.0, "ok": 0}

    connector = aiohttp.TCPConnector(limit=4096, keepalive_timeout=3.0)  # < uvicorn's 5 s
    async with aiohttp.ClientSession(connector=connector) as s:
        async def episode(env: str, idx: int) -> None:
            inst = await queues[env].get()  # one instance = one process, one episode at a time
            t0 = time.perf_counter()
            try:
                shutil.copyfile(inst["template"], inst["db"])  # reset, AWM's way
                tw = time.perf_counter()
                async with s.get(inst["url"] + "/openapi.json") as r:  # the tool list
                    await r.read()
                ops = inst["runtime"].operations
                for call in solutions[(env, idx)]:
                    op = ops[call.tool]
                    path, query, body = op.build_request(call.arguments)
                    url = inst["url"] + path + (f"?{query}" if query else "")
                    async with s.request(op.method.upper(), url, data=body,
                                         headers={"content-type": "application/json"}) as r:
                        await r.read()
                    stats["calls"] += 1
                stats["wait"] += time.perf_counter() - tw
                res = verifiers[(env, idx)](str(inst["template"]), str(inst["db"]),
                                            "The task is done.")
                stats["ok"] += res.get("result") == "complete"
                stats["calls"] += 2  # list + verify, as the farm counts them
            finally:
                stats["busy"] += time.perf_counter() - t0
                queues[env].put_nowait(inst)

        t0 = time.perf_counter()
        await asyncio.gather(*(episode(env, idx) for env, idx in groups for _ in range(GROUP)))
        wall = time.perf_counter() - t0
    n = len(groups) * GROUP
    return {"episodes": n, "seconds": round(wall, 2), "episodes_per_s": round(n / wall, 1),
            "env_calls_per_s": round(stats["calls"] / wall, 1),
            "success_rate": round(stats["ok"] / n, 4),
            "farm_wait_share": round(stats["wait"] / stats["busy"], 3)}


class AwmWay:
    """AWM's processes, started once and kept for every round (an idle uvicorn costs no CPU), so
    each round measures AWM's way beside the farm's under the same load."""

    def __init__(self, catalog: Any, per_env: int) -> None:
        import psutil

        self.catalog, self.verifiers = catalog, awm_verifiers(catalog)
        t0 = time.perf_counter()
        self.instances, self.procs, self.tmp = start_awm(catalog, per_env)
        self.start_s = time.perf_counter() - t0
        self.pss = sum(psutil.Process(p.pid).memory_full_info().pss for p in self.procs)

    def round(self, groups: list) -> dict:
        cpu0 = time.process_time()
        farm0 = sum(sum(tree_cpu(p.pid).values()) for p in self.procs)
        res = asyncio.run(awm_rollouts(self.catalog, self.instances, groups, self.verifiers))
        res["client_cpu_s"] = round(time.process_time() - cpu0, 2)
        res["farm_cpu_s"] = round(sum(sum(tree_cpu(p.pid).values()) for p in self.procs) - farm0, 2)
        return {**res, "processes": len(self.procs), "start_all_s": round(self.start_s, 1),
                "pss_mib": round(self.pss / 2**20, 1),
                "pss_per_process_mib": round(self.pss / 2**20 / len(self.procs), 1)}

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=15)
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- main ---------------------------------------------------------------------------------------
def median_of(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda r: r["episodes_per_s"])
    return {**ordered[len(ordered) // 2], "runs_seconds": [r["seconds"] for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=256, help="episodes in flight")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=1, help="Serve replicas per env app")
    ap.add_argument("--verifier-workers", type=int, default=2)
    ap.add_argument("--awm-per-env", type=int, default=16,
                    help="AWM processes per env (3 envs): as many as fit here")
    ap.add_argument("--modes", default="no_ray,no_ray_httpx,no_ray_batched,serve_http,"
                    "serve_batched,serve_handles,awm")
    ap.add_argument("--profile", action="store_true", help="cProfile the client in no_ray")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "rollout.json")
    args = ap.parse_args()
    modes = args.modes.split(",")
    catalog = load_catalog()
    policy = ScriptedPolicy.from_catalog(catalog)
    groups = make_jobs(catalog, args.episodes)
    res: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_start": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                            time.gmtime())},
        "settings": {"episodes": len(groups) * GROUP, "group": GROUP, "rounds": args.rounds,
                     "concurrency": args.concurrency, "replicas": args.replicas,
                     "verifier_workers": args.verifier_workers, "policy": "scripted"}}
    warm = args.concurrency + 2 * GROUP

    client_modes = {
        "no_ray": dict(transport="aiohttp", batched=False),
        "no_ray_httpx": dict(transport="httpx", batched=False),
        "no_ray_batched": dict(transport="aiohttp", batched=True),
        "no_ray_bare": dict(transport="aiohttp", batched=False, bare=catalog),
        "serve_bare": dict(transport="aiohttp", batched=False, bare=catalog),
        "serve_http": dict(transport="aiohttp", batched=False),
        "serve_batched": dict(transport="aiohttp", batched=True),
        "serve_handles": dict(transport="aiohttp", batched=True, incluster=True),
    }
    runs: dict[str, list[dict]] = defaultdict(list)
    local = [m for m in modes if m.startswith("no_ray")]
    served = [m for m in modes if m.startswith("serve")]
    proc = farm = awm = None
    try:
        if "awm" in modes:
            awm = AwmWay(catalog, args.awm_per_env)
        if local:
            proc, url = start_no_ray(warm, args.verifier_workers)
        if served:
            from cluster.serve import DeploymentOptions, ServeOptions, start_farm
            from envfarm.farm import FarmConfig, PoolConfig, free_port

            t0 = time.perf_counter()
            farm = start_farm(FarmConfig(pool=PoolConfig(warm=warm),
                                         verifier_workers=args.verifier_workers),
                              ServeOptions(port=free_port(), num_cpus=2,
                                           deployment=DeploymentOptions(
                                               num_replicas=args.replicas)))
            res["serve_startup_s"] = round(time.perf_counter() - t0, 1)
        # Rounds interleave the modes (both farms up at once, the idle one costs no CPU), so
        # every mode sees the same load on a shared machine: compare within a round.
        # AWM's way runs in every round too, first in odd rounds and last in even ones, so a
        # drift in the machine's load falls on both sides alike.
        for rnd in range(args.rounds):
            order = local + served + (["awm"] if awm else [])
            if awm and rnd % 2:
                order = ["awm"] + local + served
            for m in order:
                if m == "awm":
                    runs[m].append(awm.round(groups))
                else:
                    if m in local:
                        where, cpu = url, (lambda: tree_cpu(proc.pid))
                    else:  # Ray's processes are this one's children; the --no-ray farm is not
                        where, cpu = farm.url, (lambda: serve_cpu(proc.pid if proc else None))
                    runs[m].append(run_mode(where, policy, groups, args.concurrency,
                                            farm_cpu=cpu, **client_modes[m]))
                runs[m][-1]["round"], runs[m][-1]["load_avg"] = rnd, os.getloadavg()
                print(m, runs[m][-1], flush=True)
        if args.profile and local:
            res["no_ray_profile"] = run_mode(url, policy, groups, args.concurrency,
                                             "aiohttp", False, profile=True)
    finally:
        if farm is not None:
            farm.shutdown()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=15)
        if awm is not None:
            awm.close()
    for m, rs in runs.items():
        res[m] = median_of(rs)
    if local and served:  # same-round ratios: Serve's rate over the --no-ray bare rate
        base = next((m for m in local if m == "no_ray_bare"), local[0])
        res["serve_vs_no_ray_by_round"] = {m: [round(a["episodes_per_s"] / b["episodes_per_s"], 3)
                                               for a, b in zip(runs[m], runs[base])
                                               if b["episodes_per_s"]] for m in served}
    if "awm" in runs:  # same-round ratios: each farm mode's rate over AWM's way's
        res["vs_awm_by_round"] = {m: [round(a["episodes_per_s"] / b["episodes_per_s"], 3)
                                      for a, b in zip(runs[m], runs["awm"])]
                                  for m in runs if m != "awm"}
    best = max((m for m in runs if m != "awm"), key=lambda m: res[m]["episodes_per_s"],
               default=None)
    if best and "awm" in res:
        res["ratio_best_vs_awm"] = {"best": best, "ratio": round(
            res[best]["episodes_per_s"] / res["awm"]["episodes_per_s"], 2)}
    res["machine"]["loadavg_end"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items() if k != "no_ray_profile"}, indent=2))


if __name__ == "__main__":
    main()
