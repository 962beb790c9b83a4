"""The SDK at 4,096 concurrent tool calls (issue 24 §4: NeMo-Gym saw httpx hang at 16k).

Against a farm-shaped server that does no work (``tests/fakes/echo_farm.py``), so the seconds
are the client's. Each call echoes its own arguments: a reply delivered to the wrong caller
fails, and a hang fails on the deadline instead of stalling the suite.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from envfarm.client import AiohttpTransport, Farm, HTTPTransport
from tests.fakes.echo_farm import EchoFarm

CALLS = 4096


@pytest.fixture(scope="module")
def echo():
    with EchoFarm() as farm:
        yield farm


def test_the_default_transport_is_aiohttp():
    # chosen by measurement: benchmarks/farm/bench_sdk_transport.py, RESULTS.md "SDK transport"
    assert HTTPTransport is AiohttpTransport


async def test_4096_concurrent_calls_all_answer_their_own_caller(echo):
    async with Farm(echo.url, max_connections=1024) as farm:
        lease = await farm.acquire("echo")
        started = time.monotonic()
        async with asyncio.timeout(60):  # a hang fails here
            answers = await asyncio.gather(*(lease.call("echo", {"n": n})
                                             for n in range(CALLS)))
        elapsed = time.monotonic() - started
    assert [a["arguments"]["n"] for a in answers] == list(range(CALLS))
    assert all(a["tool"] == "echo" for a in answers)
    print(f"{CALLS} concurrent calls in {elapsed:.1f} s")


async def test_more_calls_than_connections_wait_for_one(echo):
    async with Farm(echo.url, max_connections=8) as farm:
        lease = await farm.acquire("echo")
        async with asyncio.timeout(30):
            answers = await asyncio.gather(*(lease.call("echo", {"n": n}) for n in range(256)))
    assert [a["arguments"]["n"] for a in answers] == list(range(256))
