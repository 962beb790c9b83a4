"""Release ordered with calls (issue 34 §2), through the farm's HTTP, batch and MCP routes.

A ``drop`` that overtook a call of its own lease (the call queued behind the lease's call in
flight, or leaving in the same pipe write) made the worker honestly answer "no instance", and
the front killed the worker for it: every other lease there got 410 ``lease_lost``. Closing a
lease now waits for its call in flight and refuses the calls queued behind it (410, closed);
the worker and its other leases carry on.
"""

from __future__ import annotations

import asyncio

import pytest

from envfarm.compose import compose_core
from envfarm.farm import FarmConfig, PoolConfig
from tests.envfarm.farm.conftest import farm_client
from tests.envfarm.worker.conftest import catalog, start_farm
from tests.envfarm.worker.farm_api import batch, gone, lease
from tests.envfarm.worker.tenancy_env import CODE

pytestmark = pytest.mark.slow
ENV = "tenancy"


@pytest.fixture(scope="module")
def farm():
    farm = start_farm({ENV: CODE}, call_timeout_s=2.0, leases_per_worker=4,
                      check_module_state=False)
    yield farm
    farm.stop()



async def _neighbours(http) -> tuple:
    """Two leases of one tenant on one worker; the second holds state of its own."""
    first, second = await lease(http, ENV), await lease(http, ENV)
    assert await first.pid() == await second.pid()
    assert (await second.call("create_note", title="neighbour-state")).json()["ok"]
    return first, second


async def _neighbour_intact(neighbour, pid: int) -> None:
    assert "neighbour-state" in await neighbour.titles()
    assert await neighbour.pid() == pid  # the very worker: it was never killed


async def test_a_call_queued_behind_the_one_in_flight_is_refused_when_its_lease_closes(http):
    first, second = await _neighbours(http)
    pid = await first.pid()
    items = [first.item("nap", seconds=0.5), first.item("create_note", title="queued")]
    running = asyncio.create_task(batch(http, items))  # the second waits for the first
    await asyncio.sleep(0.2)
    assert (await first.release()).json()["status"] == "closed"
    napped, queued = await running
    assert napped["result"]["ok"], napped  # in flight: it finished
    assert gone(queued) == "closed", queued  # queued: refused, typed, not lost
    await _neighbour_intact(second, pid)


async def test_ttl_expiry_in_the_middle_of_a_batch(http):
    first = await lease(http, ENV, ttl_s=1.0)
    second = await lease(http, ENV)
    assert (await second.call("create_note", title="neighbour-state")).json()["ok"]
    pid = await second.pid()
    await asyncio.sleep(0.5)
    items = [first.item("nap", seconds=0.7), first.item("create_note", title="late")]
    running = asyncio.create_task(batch(http, items))
    await asyncio.sleep(0.65)  # past its TTL; the first item still runs, the second waits
    r = await first.call("list_notes")  # finds it expired: closes it
    assert r.status_code == 410 and gone(r.json()) == "closed", r.text
    napped, late = await running
    assert napped["result"]["ok"] and gone(late) == "closed", (napped, late)
    await _neighbour_intact(second, pid)


@pytest.mark.parametrize("route", ["http", "batch", "mcp"])
async def test_delete_racing_calls_never_costs_another_lease(http, route):
    for attempt in range(6):
        first, second = await _neighbours(http)
        pid = await first.pid()

        async def one(k: int) -> tuple[int, dict]:
            if route == "batch":
                return 200, (await batch(http, [first.item("create_note", title=f"c{k}")]))[0]
            r = await (first.mcp_call if route == "mcp" else first.call)(
                "create_note", title=f"c{k}")
            return r.status_code, r.json()

        calls = [asyncio.create_task(one(k)) for k in range(6)]
        await asyncio.sleep(0.002 * attempt)
        await first.release()
        for status, body in await asyncio.gather(*calls):
            assert status in (200, 410), body
            assert gone(body) != "lease_lost", body
        await _neighbour_intact(second, pid)
        await second.release()


async def test_a_call_and_its_leases_drop_in_one_pipe_write(tmp_path):
    """The call's frame and the release's drop are written in one event-loop iteration: the
    drop now waits for the call (in-process HTTP, so both start in the same iteration)."""
    core = compose_core(FarmConfig(pool=PoolConfig(warm=1), call_timeout_s=2.0,
                                   leases_per_worker=4, check_module_state=False),
                        catalog=catalog(**{ENV: CODE}))
    async with farm_client(core) as c:
        first, second = await lease(c, ENV), await lease(c, ENV)
        assert (await second.call("create_note", title="neighbour-state")).json()["ok"]
        pid = await second.pid()
        for k in range(5):
            call, closed = await asyncio.gather(first.call("create_note", title=f"x{k}"),
                                                first.release())
            assert call.status_code in (200, 410) and gone(call.json()) != "lease_lost", call.text
            first = await lease(c, ENV)
        await _neighbour_intact(second, pid)
    await core.aclose()
