"""envfarm's OpenEnv endpoint beside OpenEnv's own AWM server, behind the same client.

The client is OpenEnv's ``AWMEnv`` (an openenv-core ``MCPToolClient``), taken from a checkout of
meta-pytorch/OpenEnv (``--awm-root``: its ``envs/`` folder); the same scenario and task on both
servers, from the same AWM files. Per server: sessions opened per second (``reset`` to
``reset_ok``, ``--concurrency`` at once), memory per open session (PSS of the server's whole
process tree, sessions open minus none), and the largest number of sessions held at once, ramped
in steps up to a cap (a session that fails to open ends the ramp).

OpenEnv's server starts a process per session; its dependencies (fastapi-mcp 0.4.0 needs
``mcp<2``) go in a venv of their own (``--awm-python``). Everything binds loopback:

    python -m venv /tmp/awm && /tmp/awm/bin/pip install 'openenv-core[core]==0.3.0' \\
        fastapi-mcp==0.4.0 'mcp<2' sqlalchemy openai huggingface-hub
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python \\
        benchmarks/farm/bench_openenv_peer.py --awm-root PATH/TO/OpenEnv/envs --awm-python /tmp/awm/bin/python'

Writes benchmarks/results/openenv_peer.json (``--quick``: small counts, no file).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from envfarm.farm import free_port

ROOT = Path(__file__).resolve().parents[1]
AWM_DATA = ROOT.parent / "shared" / "awm1k_samples"


def tree_pss(pid: int) -> int:
    """PSS of a process and all its descendants, bytes (shared pages counted once overall)."""
    total = 0
    proc = psutil.Process(pid)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def start(cmd: list[str], env: dict[str, str], cwd: Path, url: str,
          timeout_s: float = 180) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[:4]} exited with {proc.returncode}")
        for path in ("/healthz", "/health"):
            try:
                if httpx.get(url + path, timeout=2).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{cmd[:4]} did not answer in {timeout_s:g} s")


def stop(proc: subprocess.Popen) -> None:
    """End the server and what it started (sessions' processes, env workers)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    proc.kill()
    proc.wait()


#: Why the first session that did not open failed (the ramp's end, in the results).
FIRST_FAILURE: list[str] = []


async def open_sessions(client_cls: type, url: str, n: int, concurrency: int, scenario: str,
                        task: int) -> tuple[list[Any], int, float]:
    """``n`` sessions reset at ``concurrency`` at once: (the open clients, failures, seconds)."""
    gate = asyncio.Semaphore(concurrency)
    opened: list[Any] = []
    failures = 0

    async def one() -> None:
        nonlocal failures
        async with gate:
            env = client_cls(base_url=url, message_timeout_s=600, connect_timeout_s=60)
            try:
                await env.connect()
                obs = (await env.reset(scenario=scenario, task_idx=task)).observation
                why = (None if getattr(obs, "reward_type", None) == "reset_ok"
                       else f"{getattr(obs, 'reward_type', '?')}: {getattr(obs, 'error', '')}")
            except Exception as exc:  # noqa: BLE001 - a session that did not open is counted
                why = f"{type(exc).__name__}: {exc}"
            if why is None:
                opened.append(env)
            else:
                failures += 1
                FIRST_FAILURE.append(why[:300])
                await env.close()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return opened, failures, time.perf_counter() - started


async def measure(name: str, url: str, pid: int, client_cls: type, args: argparse.Namespace,
                  cap: int, step: int) -> dict[str, Any]:
    warm, _, _ = await open_sessions(client_cls, url, 1, 1, args.env, args.task)  # load once
    await asyncio.gather(*(c.close() for c in warm))
    await asyncio.sleep(2)
    base = tree_pss(pid)
    held, failed, seconds = await open_sessions(client_cls, url, args.sessions,
                                                args.concurrency, args.env, args.task)
    with_open = tree_pss(pid)
    out: dict[str, Any] = {
        "server": name, "sessions": args.sessions, "concurrency": args.concurrency,
        "opened": len(held), "failed": failed, "seconds": round(seconds, 3),
        "sessions_per_s": round(len(held) / seconds, 2),
        "base_mib": round(base / 2**20, 1),
        "mib_per_session": round((with_open - base) / 2**20 / max(len(held), 1), 3)}
    while len(held) < cap and not failed:
        more, failed, _ = await open_sessions(client_cls, url, min(step, cap - len(held)),
                                              args.concurrency, args.env, args.task)
        held += more
        print(f"  {name}: {len(held)} sessions held", file=sys.stderr)
    at_max = tree_pss(pid)
    out.update({"max_held": len(held), "ramp_cap": cap, "ramp_ended_by_failure": bool(failed),
                "first_failure": FIRST_FAILURE[0] if FIRST_FAILURE else None,
                "mib_at_max": round(at_max / 2**20, 1),
                "mib_per_session_at_max": round((at_max - base) / 2**20 / max(len(held), 1),
                                                3)})
    FIRST_FAILURE.clear()
    await asyncio.gather(*(c.close() for c in held), return_exceptions=True)
    return out


def client_class(awm_root: Path | None) -> type:
    if awm_root is not None:
        sys.path.insert(0, str(awm_root))
        from agent_world_model_env.client import AWMEnv

        return AWMEnv
    from types import SimpleNamespace

    from openenv.core.client_types import StepResult
    from openenv.core.mcp_client import MCPToolClient

    class Fields(MCPToolClient):  # keeps the AWM fields, as AWMEnv does
        def _parse_result(self, payload: dict[str, Any]) -> StepResult:
            return StepResult(observation=SimpleNamespace(**payload.get("observation", {})),
                              reward=payload.get("reward"), done=payload.get("done", False))

    return Fields


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--awm-root", type=Path, default=None,
                        help="envs/ of a meta-pytorch/OpenEnv checkout (the peer and AWMEnv)")
    parser.add_argument("--awm-python", default=None, help="python of the peer's venv")
    parser.add_argument("--awm-data", type=Path, default=AWM_DATA)
    parser.add_argument("--env", default="content_platform_1")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--peer-cap", type=int, default=48)
    parser.add_argument("--farm-cap", type=int, default=2048)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" /
                                              "openenv_peer.json"))
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.peer_cap, args.farm_cap = 4, 8, 64
    client = client_class(args.awm_root)
    rows = []
    load_before = os.getloadavg()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    farm = start([sys.executable, "-m", "envfarm.cli", "serve", "--no-ray", "--catalog",
                  str(args.awm_data), "--envs", args.env, "--port", str(port)],
                 {**os.environ, "PYTHONPATH": str(ROOT)}, ROOT, url)
    try:
        rows.append(await measure("envfarm --no-ray", url, farm.pid, client, args,
                                  args.farm_cap, 256))
    finally:
        stop(farm)
    if args.awm_root is not None and args.awm_python:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        peer = start([args.awm_python, "-m", "uvicorn", "agent_world_model_env.server.app:app",
                      "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                     {**os.environ, "PYTHONPATH": str(args.awm_root),
                      "AWM_DATA_DIR": str(args.awm_data)}, args.awm_root, url)
        try:
            rows.append(await measure("OpenEnv AWM server", url, peer.pid, client, args,
                                      args.peer_cap, 8))
        finally:
            stop(peer)
    free = psutil.virtual_memory().available
    for r in rows:  # at scale a session also carries its share of the processes serving it
        per = max(r["mib_per_session"], r["mib_per_session_at_max"])
        r["est_max_by_memory"] = int(free / max(per * 2**20, 1))
    print("| server | sessions/s | MiB per open session (at the cap) | held at once (cap) "
          "| base MiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['server']} | {r['sessions_per_s']} | {r['mib_per_session']} "
              f"({r['mib_per_session_at_max']}) | "
              f"{r['max_held']} ({r['ramp_cap']}{', a session failed' if r['ramp_ended_by_failure'] else ''}) | "
              f"{r['base_mib']} |")
    if not args.quick:
        Path(args.json).write_text(json.dumps({
            "machine": platform.node(), "cpus": os.cpu_count(),
            "mem_total_mib": psutil.virtual_memory().total // 2**20,
            "available_mib": free // 2**20, "load_before": load_before,
            "load_after": os.getloadavg(), "time": time.time(), "client": client.__name__,
            "env": args.env, "task": args.task, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
