"""Traffic helpers for the Serve fault tests: leases that write their own state and read it back,
with every HTTP answer counted by kind (ours vs HAProxy's own error pages)."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass, field

import httpx

from tests.cluster.serve.conftest import ENV

#: A wishlist named like a lease id was written by a lease (the env's seed data has others).
LEASE_NAME = re.compile(r"^[A-Za-z0-9_]+-[0-9a-f]{16}$")


def owner(info: dict) -> str:
    return info["lease_id"].split("-")[0]


def lease_path(info: dict) -> str:
    return f"/envs/{ENV}/leases/{info['lease_id']}"


def auth(info: dict) -> dict[str, str]:
    return {"Authorization": f"Bearer {info['token']}"}


@dataclass
class Tally:
    """Every answer the traffic got. ``ours_5xx``: a 5xx our code (or Serve under it) sent;
    ``proxy_5xx``: HAProxy's own error page (no JSON body); ``wrong_state``: a read that saw
    no own write or another lease's state; ``transport``: the connection itself failed."""

    statuses: Counter = field(default_factory=Counter)
    ours_5xx: list[str] = field(default_factory=list)
    proxy_5xx: list[int] = field(default_factory=list)
    wrong_state: list[str] = field(default_factory=list)
    gone: dict[str, str] = field(default_factory=dict)  # lease_id -> error kind
    transport: list[str] = field(default_factory=list)

    def count(self, r: httpx.Response) -> None:
        self.statuses[r.status_code] += 1
        if r.status_code >= 500:
            if "json" in r.headers.get("content-type", ""):
                self.ours_5xx.append(f"{r.status_code} {r.text[:200]}")
            elif b"<html>" in r.content.lower() or not r.content:
                self.proxy_5xx.append(r.status_code)
            else:
                self.ours_5xx.append(f"{r.status_code} {r.text[:200]}")

    def summary(self) -> str:
        return (f"statuses={dict(self.statuses)} ours_5xx={len(self.ours_5xx)} "
                f"haproxy_5xx={len(self.proxy_5xx)} transport={len(self.transport)} "
                f"wrong_state={len(self.wrong_state)} gone={len(self.gone)}")


async def acquire(c: httpx.AsyncClient, tally: Tally) -> dict | None:
    r = await c.post(f"/envs/{ENV}/leases", json={})
    tally.count(r)
    return r.json() if r.status_code == 201 else None


async def write(c: httpx.AsyncClient, info: dict, tally: Tally) -> bool:
    """Give the lease its own state: a wishlist named after it."""
    r = await c.post(lease_path(info) + "/call", headers=auth(info),
                     json={"tool": "create_wishlist", "arguments": {"name": info["lease_id"]}})
    tally.count(r)
    return r.status_code == 200 and r.json()["ok"]


async def check(c: httpx.AsyncClient, info: dict, tally: Tally) -> int:
    """Read the lease's state back: its own wishlist and no other lease's, or a typed 410."""
    try:
        r = await c.post(lease_path(info) + "/call", headers=auth(info),
                         json={"tool": "list_wishlists"})
    except httpx.TransportError as exc:
        tally.transport.append(repr(exc))
        return 0
    tally.count(r)
    if r.status_code == 200:
        names = [w["name"] for w in r.json()["result"]["wishlists"]
                 if LEASE_NAME.match(w["name"])]
        if names != [info["lease_id"]]:
            tally.wrong_state.append(f"{info['lease_id']} saw {names}")
    elif r.status_code == 410:
        tally.gone[info["lease_id"]] = r.json()["error"]["kind"]
    return r.status_code


async def churn(c: httpx.AsyncClient, tally: Tally, stop: asyncio.Event, held: list[dict]) -> None:
    """Load until ``stop``: a lease, its state written, then reads until a new lease is due
    (every 20 calls, so leases also land on replicas that start meanwhile)."""
    while not stop.is_set():
        info = await acquire(c, tally)
        if info is None or not await write(c, info, tally):
            continue
        held.append(info)
        for _ in range(20):
            if stop.is_set() or await check(c, info, tally) != 200:
                break
