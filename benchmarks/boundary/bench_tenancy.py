"""What issue 34's tenancy costs: one tenant per worker, committed state kept by the front,
leases that outlive their worker. This checkout against ``--before`` (another checkout, e.g.
main's), side by side in one run, same env, tool, client and cores.

- memory: PSS by role (front, env workers) of a ``--no-ray`` farm holding 1,024 leases of
  hotel_booking_1, each called with a write then a read (so each holds state of its own, and
  its rollback point, as from an episode's second call on), as one tenant x 1,024, as 8
  tenants x 128 (whole workers each) and 8 x 100 (each tenant's last worker part full).
- per call: the farm's CPU (front + workers, every process of its tree) per call, for a read
  tool and a write tool, 64 calls in flight over 32 leases, interleaved rounds.
- recovery (this checkout): a worker holding 64 leases is killed; wall time until all 64
  answer again, and how many were lost (none had a call in flight: 0 expected).
- pieces (this checkout, in process): what each call now does more, timed alone (the farm's
  per-call CPU on a shared machine moves more than these add): the state key after a read, the
  page delta after a write and its patching in the front, the reply reader against the old one.

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/boundary/bench_tenancy.py \\
        --before /tmp/main-checkout'
Raw results: benchmarks/results/tenancy.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.boundary.bench_boundary import pss_mib  # noqa: E402
from benchmarks.serve.bench_dataplane import ENV, Farm  # noqa: E402
from benchmarks.trainer.bench_rollout import tree_cpu  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "tenancy.json"
#: (tool, arguments of the k-th call)
READ = ("get_my_profile", lambda k: {})
WRITE = ("create_wishlist", lambda k: {"name": f"bench-{k}"})
TENANTS = [(f"t{i}", f"efk_bench-tenant-{i}-0123456789abcdef") for i in range(8)]
_KEYS = ",".join(f"{name}:{key}" for name, key in TENANTS)


def _farm(repo: Path) -> Farm:
    return Farm(f"no-ray@ENVFARM_API_KEYS={_KEYS}", warm=8, repo=repo)


def _tree_cpu(pid: int) -> float:
    return sum(tree_cpu(pid).values())


async def _lease(c, count: int, key: str) -> list[dict]:
    out: list[dict] = []
    while len(out) < count:
        r = await c.post(f"/envs/{ENV}/leases:batch", json={"count": min(256, count - len(out))},
                         headers={"X-Envfarm-Key": key})
        if r.status_code != 201:
            raise RuntimeError(f"leasing: {r.status_code} {r.text[:500]}")
        out += r.json()
    return out


async def _calls(c, held: list[dict], tool: tuple, n: int, inflight: int = 64,
                 first: int = 0) -> None:
    sem = asyncio.Semaphore(inflight)

    async def one(k: int) -> None:
        le = held[k % len(held)]
        async with sem:
            r = await c.post(f"/envs/{ENV}/leases/{le['lease_id']}/call",
                             headers={"Authorization": f"Bearer {le['token']}"},
                             json={"tool": tool[0], "arguments": tool[1](first + k)})
        if r.status_code != 200 or not r.json()["ok"]:
            raise RuntimeError(f"{tool[0]}: {r.status_code} {r.text[:300]}")

    await asyncio.gather(*(one(k) for k in range(n)))


def memory(repo: Path, tenants: int, per_tenant: int) -> dict[str, Any]:
    import httpx

    async def fill(url: str) -> int:
        async with httpx.AsyncClient(base_url=url, timeout=300) as c:
            held = []
            for _, key in TENANTS[:tenants]:
                held += await _lease(c, per_tenant, key)
            # each lease writes once, then reads: its rollback point then holds its own state
            # (as from the second call of any episode on)
            await _calls(c, held, WRITE, len(held))
            await _calls(c, held, READ, len(held))
            return (await c.get(f"/envs/{ENV}")).json()["pool"].get("workers")

    farm = _farm(repo)
    try:
        before = pss_mib(farm.proc.pid)
        t0 = time.perf_counter()
        workers = asyncio.run(fill(farm.url))
        fill_s = time.perf_counter() - t0
        after = pss_mib(farm.proc.pid)
    finally:
        farm.stop()
    leases = tenants * per_tenant
    return {"tenants": tenants, "leases": leases, "workers": workers,
            "fill_s": round(fill_s, 1), "pss_mib_idle": before, "pss_mib_with_leases": after,
            "mib_per_lease": round((after["total"] - before["total"]) / leases, 3),
            "front_mib_per_lease": round((after.get("front", 0) - before.get("front", 0))
                                         / leases, 4)}


def per_call(repo: Path, n: int) -> dict[str, Any]:
    import httpx

    async def run(url: str, pid: int) -> dict[str, Any]:
        out = {}
        async with httpx.AsyncClient(base_url=url, timeout=120,
                                     limits=httpx.Limits(max_connections=64)) as c:
            held = await _lease(c, 32, TENANTS[0][1])
            for name, tool in (("read", READ), ("write", WRITE)):
                await _calls(c, held, tool, 256)  # warm
                cpu, t0 = _tree_cpu(pid), time.perf_counter()
                await _calls(c, held, tool, n, first=256)
                wall = time.perf_counter() - t0
                out[name] = {"us_cpu_per_call": round((_tree_cpu(pid) - cpu) / n * 1e6, 1),
                             "calls_per_s": round(n / wall, 1)}
        return out

    farm = _farm(repo)
    try:
        return asyncio.run(run(farm.url, farm.proc.pid))
    finally:
        farm.stop()


def recovery() -> dict[str, Any]:
    import httpx
    import psutil

    async def run(url: str, pid: int) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            held = await _lease(c, 64, TENANTS[0][1])
            await _calls(c, held, WRITE, 64)
            workers = [p for p in psutil.Process(pid).children(recursive=True)
                       if "envfarm.worker" in " ".join(p.cmdline())]
            holder = max(workers, key=lambda p: p.memory_info().rss)  # the one with the leases
            os.kill(holder.pid, signal.SIGKILL)  # a worker of the farm this script started
            await asyncio.sleep(0.2)
            t0 = time.perf_counter()
            answers = await asyncio.gather(*(
                c.post(f"/envs/{ENV}/leases/{le['lease_id']}/call",
                       headers={"Authorization": f"Bearer {le['token']}"},
                       json={"tool": "get_my_profile", "arguments": {}}) for le in held))
            wall = time.perf_counter() - t0
        return {"leases": len(held), "answered_again_s": round(wall, 2),
                "lost": sum(a.status_code == 410 for a in answers),
                "ok": sum(a.status_code == 200 and a.json()["ok"] for a in answers)}

    farm = _farm(REPO)
    try:
        return asyncio.run(run(farm.url, farm.proc.pid))
    finally:
        farm.stop()


def _us(fn, n: int) -> float:
    """CPU µs per ``fn()`` (process time: a loaded machine stretches wall time, not this)."""
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return round((time.process_time() - t0) / n * 1e6, 2)


def pieces(n: int = 2000) -> dict[str, Any]:
    from envfarm.catalog import load_catalog
    from envfarm.runtime import EnvRuntime
    from envfarm.worker import _frames
    from envfarm.worker._committed import CommittedState, Template

    runtime = EnvRuntime(load_catalog()[ENV])
    inst = runtime.instance()
    template = Template(runtime.template.data)
    state = CommittedState(template)
    assert inst.call_sync(READ[0], READ[1](0)).ok
    out = {"db_bytes": len(runtime.template.data),
           "state_key_after_a_read_us": _us(inst.committed, n)}
    shipped, deltas, writes = runtime.template.data, [], []
    for k in range(200):  # writes as an episode makes them, each shipped as a delta
        assert inst.call_sync(WRITE[0], WRITE[1](k)).ok
        image = inst.committed()
        t0 = time.process_time()
        for _ in range(20):
            delta = _frames.encode_delta(shipped, image)
        t1 = time.process_time()
        for _ in range(20):
            state.apply(delta)
        writes.append(((t1 - t0) / 20, (time.process_time() - t1) / 20))
        deltas.append(len(delta))
        shipped = image
    assert state.image() == inst.snapshot()
    out["delta_encode_in_worker_us"] = round(sum(w[0] for w in writes) / len(writes) * 1e6, 1)
    out["delta_apply_in_front_us"] = round(sum(w[1] for w in writes) / len(writes) * 1e6, 1)
    out["delta_bytes_per_write"] = round(sum(deltas) / len(deltas))
    out["front_state_kib_after_200_writes"] = round(state.own / 1024, 1)
    reply = _frames.encode({"ok": True, "rlen": 600, "id": 7}, b"x" * 600)
    old = _frames.FrameReader()
    new = _frames.ReplyReader(lambda header, size: None, lambda header, payload: None)
    out["old_reader_us"] = _us(lambda: [_frames.decode(b) for b in old.feed(reply)], n)
    out["reply_reader_us"] = _us(lambda: new.feed(reply), n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, help="another checkout to compare against (main)")
    ap.add_argument("--calls", type=int, default=3000, help="calls per figure")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved per-call rounds")
    ap.add_argument("--note", default="", help="what else ran on the machine")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", choices=["pieces"], help="just this part")
    args = ap.parse_args()
    if args.only == "pieces":
        print(json.dumps(pieces()), flush=True)
        return
    repos = {"this": REPO, **({"before": args.before} if args.before else {})}
    res: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_start": os.getloadavg(), "note": args.note,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
        "memory": [], "per_call": [], "recovery": None, "pieces": None}
    for tenants, per_tenant in ((1, 1024), (8, 128), (8, 100)):
        for label, repo in repos.items():
            row = {"checkout": label, **memory(repo, tenants, per_tenant),
                   "load_avg": os.getloadavg()}
            res["memory"].append(row)
            print(json.dumps(row), flush=True)
    for r in range(args.rounds):
        for label, repo in repos.items():
            row = {"round": r, "checkout": label, **per_call(repo, args.calls),
                   "load_avg": os.getloadavg()}
            res["per_call"].append(row)
            print(json.dumps(row), flush=True)
    res["recovery"] = recovery()
    print(json.dumps({"recovery": res["recovery"]}), flush=True)
    res["pieces"] = pieces()
    print(json.dumps({"pieces": res["pieces"]}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
