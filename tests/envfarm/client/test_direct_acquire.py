"""``Farm(direct=True)`` asks new leases of the front and of the owners' listeners it was named
in turn, so a Door carries only a share of them. Two ``--no-ray`` farms on loopback stand in for
two pool replicas' listeners; a front in front of them places leases in turn and names the
listener of each, as the Door does."""

from __future__ import annotations

import itertools
import json as jsonlib

from cluster.compose import LocalFarm
from envfarm.client import Farm, HTTPTransport, Reply
from envfarm.farm import FarmConfig, PoolConfig

ENV = "hotel_booking_1"


class _Door:
    """Places each new lease on the next replica and names its listener (``direct_url``)."""

    def __init__(self, *replicas: LocalFarm) -> None:
        self.replicas = [(r.url, HTTPTransport(r.url)) for r in replicas]
        self.next = itertools.cycle(self.replicas)
        self.seen: list[tuple[str, str]] = []

    async def request(self, method, path, *, json=None, headers=None) -> Reply:
        self.seen.append((method, path))
        url, replica = next(self.next)
        reply = await replica.request(method, path, json=json, headers=headers)
        if reply.status == 201:
            info = jsonlib.loads(reply.body)
            info["direct_url"] = url
            reply = Reply(201, jsonlib.dumps(info).encode(), reply.headers)
        return reply

    async def aclose(self) -> None:
        for _, replica in self.replicas:
            await replica.aclose()


def _farm() -> LocalFarm:
    return LocalFarm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2)))


async def test_new_leases_take_turns_among_the_front_and_the_listeners_named():
    with _farm() as a, _farm() as b:
        door = _Door(a, b)
        async with Farm("http://door", transport=door, direct=True, backoff_s=0) as farm:
            leases = [await farm.acquire(ENV) for _ in range(6)]
            to_door = [p for m, p in door.seen if m == "POST"]
            assert to_door == [f"/envs/{ENV}/leases"] * 3  # the 1st, 3rd and 6th
            held = {a.url: set(a.core.leases), b.url: set(b.core.leases)}
            for lease in leases:  # each names the listener of the replica that made it
                assert lease.lease_id in held[lease.info.direct_url]
                await lease.call("create_wishlist", {"name": "mine"})  # straight there
            assert len(held[a.url]) == 4 and len(held[b.url]) == 2
            assert [p for _, p in door.seen if p.endswith("/call")] == []

            b.stop()  # a replica dies: its listener refuses; new leases go on elsewhere
            more = [await farm.acquire(ENV) for _ in range(3)]
            assert all(lease.info.direct_url == a.url for lease in more)
            assert farm._listeners[ENV] == [a.url]


async def test_a_plain_client_asks_every_new_lease_of_the_front():
    with _farm() as a, _farm() as b:
        door = _Door(a, b)
        async with Farm("http://door", transport=door, backoff_s=0) as farm:
            for _ in range(4):
                await farm.acquire(ENV)
        assert len([p for m, p in door.seen if m == "POST"]) == 4
