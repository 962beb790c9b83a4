"""Load generators shared by the farm benchmarks (aiohttp: a lighter client than httpx)."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

TOOL = "get_my_profile"
ENV = "hotel_booking_1"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(latencies_s: list[float], calls: int, elapsed_s: float, **extra: Any) -> dict:
    return {"calls": calls, "seconds": round(elapsed_s, 2),
            "calls_per_s": round(calls / elapsed_s, 1) if elapsed_s else 0.0,
            "p50_ms": round(pct(latencies_s, 0.5) * 1000, 2),
            "p99_ms": round(pct(latencies_s, 0.99) * 1000, 2), **extra}


def session(limit: int = 2048) -> aiohttp.ClientSession:
    """A client; with the tenant key of ``$ENVFARM_API_KEY`` when the farm needs one."""
    key = os.environ.get("ENVFARM_API_KEY")
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=120),
                                 headers={"X-Envfarm-Key": key} if key else None)


async def acquire(s: aiohttp.ClientSession, url: str, env: str = ENV) -> dict:
    async with s.post(f"{url}/envs/{env}/leases", json={}) as r:
        if r.status != 201:
            raise RuntimeError(f"lease failed: {r.status} {await r.text()}")
        return await r.json()


async def release(s: aiohttp.ClientSession, url: str, lease: dict) -> None:
    async with s.delete(f"{url}/envs/{lease['env']}/leases/{lease['lease_id']}",
                        headers=auth(lease)) as r:
        await r.read()


def auth(lease: dict) -> dict[str, str]:
    return {"Authorization": f"Bearer {lease['token']}"}


async def lease_latency(url: str, n: int = 300) -> dict:
    """Sequential acquire (+ release, so the pool stays warm): p50/p99 of the acquire."""
    lat: list[float] = []
    async with session() as s:
        for _ in range(20):  # warm the connection and code paths
            await release(s, url, await acquire(s, url))
        for _ in range(n):
            t0 = time.perf_counter()
            lease = await acquire(s, url)
            lat.append(time.perf_counter() - t0)
            await release(s, url, lease)
    return {"n": n, "p50_ms": round(pct(lat, 0.5) * 1000, 2),
            "p99_ms": round(pct(lat, 0.99) * 1000, 2),
            "mean_ms": round(statistics.fmean(lat) * 1000, 2)}


async def _drive(workers: int, duration_s: float,
                 one: Callable[[int], Awaitable[int]]) -> tuple[list[float], int, float]:
    lat: list[float] = []
    calls = 0
    stop = time.perf_counter() + duration_s

    async def worker(i: int) -> None:
        nonlocal calls
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            done = await one(i)  # not `calls += await ...`: that reads calls before awaiting
            calls += done
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    return lat, calls, time.perf_counter() - t0


async def http_calls(url: str, workers: int = 32, duration_s: float = 8.0) -> dict:
    """One lease per worker; each worker calls a cheap tool in a loop."""
    async with session() as s:
        leases = [await acquire(s, url) for _ in range(workers)]
        body = {"tool": TOOL, "arguments": {}}

        async def one(i: int) -> int:
            lease = leases[i]
            async with s.post(f"{url}/envs/{ENV}/leases/{lease['lease_id']}/call",
                              json=body, headers=auth(lease)) as r:
                data = await r.json()
                if not data.get("ok"):
                    raise RuntimeError(str(data)[:300])
            return 1

        lat, calls, elapsed = await _drive(workers, duration_s, one)
        for lease in leases:
            await release(s, url, lease)
    return summary(lat, calls, elapsed, workers=workers)


async def batched_calls(url: str, workers: int = 4, batch: int = 64,
                        duration_s: float = 8.0, via: str = "owner") -> dict:
    """Each request carries up to ``batch`` calls, one per lease.

    ``via="owner"``: ``POST /envs/{env}/owners/{owner}/batch`` with leases of one owner replica
    (one hop through Serve). ``via="front"``: ``POST /batch/call`` with any leases (the front app
    fans them out to the owners through DeploymentHandles).
    """
    async with session() as s:
        leases = [await acquire(s, url) for _ in range(workers * batch)]
        if via == "owner":
            by_owner: dict[str, list[dict]] = {}
            for le in leases:
                by_owner.setdefault(le["lease_id"].rpartition("-")[0], []).append(le)
            groups = [g[i:i + batch] for g in by_owner.values() for i in range(0, len(g), batch)]
        else:
            groups = [leases[i:i + batch] for i in range(0, len(leases), batch)]

        async def one(i: int) -> int:
            group = groups[i]
            body = {"calls": [{"env": ENV, "lease_id": le["lease_id"], "token": le["token"],
                               "tool": TOOL, "arguments": {}} for le in group]}
            path = (f"/envs/{ENV}/owners/{group[0]['lease_id'].rpartition('-')[0]}/batch"
                    if via == "owner" else "/batch/call")
            async with s.post(url + path, json=body) as r:
                data = await r.json()
                ok = sum(1 for x in data["results"] if x.get("result") and x["result"]["ok"])
                if ok != len(group):
                    raise RuntimeError(str(data)[:300])
            return len(group)

        lat, calls, elapsed = await _drive(len(groups), duration_s, one)
        for lease in leases:
            await release(s, url, lease)
    return summary(lat, calls, elapsed, requests_in_flight=len(groups), batch=batch, via=via,
                   note="latency is per batch request")


async def lease_batch_latency(url: str, count: int = 16, n: int = 40) -> dict:
    """``POST /envs/{env}/leases:batch`` with ``count`` leases: per-request and per-lease."""
    lat: list[float] = []
    async with session() as s:
        for k in range(n + 5):
            t0 = time.perf_counter()
            async with s.post(f"{url}/envs/{ENV}/leases:batch", json={"count": count}) as r:
                infos = await r.json()
            if k >= 5:
                lat.append(time.perf_counter() - t0)
            for info in infos:
                await release(s, url, info)
    return {"count": count, "n": n, "p50_ms": round(pct(lat, 0.5) * 1000, 2),
            "p99_ms": round(pct(lat, 0.99) * 1000, 2),
            "per_lease_p50_ms": round(pct(lat, 0.5) * 1000 / count, 2)}


async def mcp_calls(url: str, workers: int = 32, duration_s: float = 8.0) -> dict:
    """MCP ``tools/call`` JSON-RPC over streamable HTTP (stateless, JSON responses)."""
    async with session() as s:
        leases = [await acquire(s, url) for _ in range(workers)]
        msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": TOOL, "arguments": {}}}
        accept = {"Accept": "application/json, text/event-stream"}

        async def one(i: int) -> int:
            lease = leases[i]
            async with s.post(lease["mcp_url"], json=msg,
                              headers={**auth(lease), **accept}) as r:
                data = await r.json()
                if "result" not in data or data["result"].get("isError"):
                    raise RuntimeError(str(data)[:300])
            return 1

        lat, calls, elapsed = await _drive(workers, duration_s, one)
        for lease in leases:
            await release(s, url, lease)
    return summary(lat, calls, elapsed, workers=workers)


def tree_memory(root_pid: int | None = None, exclude_self: bool = True,
                exclude: set[int] | frozenset[int] = frozenset()) -> dict:
    """RSS and PSS (MiB) summed over a process and all its descendants (minus ``exclude``)."""
    import psutil

    root = psutil.Process(root_pid or os.getpid())
    procs = root.children(recursive=True) + ([] if exclude_self else [root])
    procs = [p for p in procs if p.pid not in exclude]
    rss = pss = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return {"processes": len(procs), "rss_mib": round(rss / 2**20, 1),
            "pss_mib": round(pss / 2**20, 1)}


async def handle_acquire(n: int = 100) -> dict:
    """Lease acquire over DeploymentHandles from this (driver) process, no HTTP proxy."""
    from envfarm.serve import InClusterFarm

    farm = await InClusterFarm.connect()
    lat = []
    for _ in range(n + 20):
        t0 = time.perf_counter()
        lease = await farm.lease(ENV)
        lat.append(time.perf_counter() - t0)
        await farm.release(lease)
    return {"n": n, "p50_ms": round(pct(lat[20:], 0.5) * 1000, 2),
            "p99_ms": round(pct(lat[20:], 0.99) * 1000, 2)}


async def handle_calls(duration_s: float, workers: int = 4, batch: int = 64) -> dict:
    """The in-cluster path: batched calls over DeploymentHandles from this (driver) process."""
    from envfarm.serve import InClusterFarm

    farm = await InClusterFarm.connect()
    groups = [[await farm.lease(ENV) for _ in range(batch)] for _ in range(workers)]

    async def one(i: int) -> int:
        out = await farm.call_many([(lease, TOOL, {}) for lease in groups[i]])
        return sum(1 for r in out if r.result is not None and r.result.ok)

    lat, calls, elapsed = await _drive(workers, duration_s, one)
    for g in groups:
        for lease in g:
            await farm.release(lease)
    return summary(lat, calls, elapsed, workers=workers, batch=batch,
                   note="latency is per batch of calls")
