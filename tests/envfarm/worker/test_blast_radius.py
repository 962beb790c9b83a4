"""Blast radius one (issue 34 §5, §1's CPU watch, §6's worker that stops reading), through HTTP.

A worker crashes, misses a deadline, is killed for burning CPU nobody asked for, or stops
reading its channel: only the lease whose call caused it is lost. The other leases on it
continue on a fresh worker from their last completed call (the front's copy of their
database): a call of theirs that was in flight then runs again, alone on a fresh worker, and
answers; their state and verification reflect every completed call, once.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time

import psutil
import pytest

from tests.envfarm.worker.conftest import start_farm
from tests.envfarm.worker.farm_api import gone, lease
from tests.envfarm.worker.tenancy_env import CODE

pytestmark = pytest.mark.slow
ENV = "tenancy"
CALL_TIMEOUT_S = 1.5


@pytest.fixture(scope="module")
def farm():
    farm = start_farm({ENV: CODE}, call_timeout_s=CALL_TIMEOUT_S, leases_per_worker=16,
                      check_module_state=False, spare_workers=2)
    yield farm
    farm.stop()



async def _crew(http, size: int) -> list:
    """``size`` leases on one worker, each with a note of its own."""
    crew = [await lease(http, ENV) for _ in range(size)]
    assert len({await held.pid() for held in crew}) == 1
    for k, held in enumerate(crew):
        assert (await held.call("create_note", title=f"kept-{k}")).json()["ok"]
    return crew


async def _notes_in_snapshot(held) -> list[str]:
    """The titles in the lease's database as verification reads it (GET snapshot)."""
    r = await held.http.get(held.path + "/snapshot", headers=held.auth)
    assert r.status_code == 200, r.text
    conn = sqlite3.connect(":memory:")
    conn.deserialize(r.content)
    return [row[0] for row in conn.execute("SELECT title FROM notes ORDER BY id")]


def _dead(pid: int) -> bool:
    return not psutil.pid_exists(pid)  # the front reaps the workers it kills


@pytest.mark.parametrize("fault", [
    ("hang_in_c", {"after": 0.2}),
    ("crash", {"after": 0.2}),
    ("alarm", {"seconds": 1, "wait": 3.0}),
    ("swallow_on_the_loop", {}),
])
async def test_only_the_guilty_lease_is_lost_with_calls_in_flight(http, fault):
    tool, arguments = fault
    crew = await _crew(http, 7)
    pid = await crew[0].pid()
    guilty, busy, idle = crew[0], crew[1:5], crew[5:]
    calls = [asyncio.create_task(held.call("nap_then_note", seconds=0.6, title=f"inflight-{k}"))
             for k, held in enumerate(busy)]
    await asyncio.sleep(0.1)  # the innocents' calls are in flight when the fault strikes
    r = await guilty.call(tool, **arguments)
    assert r.status_code == 410 and gone(r.json()) == "lease_lost", r.text
    for k, answer in enumerate(await asyncio.gather(*calls)):
        assert answer.status_code == 200 and answer.json()["ok"], answer.text
        assert answer.json()["result"] == {"noted": f"inflight-{k}"}
    assert _dead(pid)
    for k, held in enumerate(busy):  # every completed call, once, in what verify reads
        titles = await _notes_in_snapshot(held)
        assert titles[-2:] == [f"kept-{k + 1}", f"inflight-{k}"], titles
        assert (await held.call("list_notes")).json()["ok"]  # its next call works
    for k, held in enumerate(idle, start=5):
        assert (await held.titles())[-1] == f"kept-{k}"
    r = await guilty.call("list_notes")
    assert r.status_code == 410 and gone(r.json()) == "lease_lost"


async def test_a_thread_spinning_after_its_lease_is_released_gets_its_worker_killed(http):
    crew = await _crew(http, 3)
    spinner, teammates = crew[0], crew[1:]
    pid = await spinner.pid()
    assert (await spinner.call("spin_thread")).json()["ok"]
    await spinner.release()  # nothing in flight, nothing leased: the thread spins on
    deadline = time.monotonic() + 6
    while not _dead(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert _dead(pid), "the worker still spins"
    for k, held in enumerate(teammates, start=1):  # not lost: no call of theirs to blame
        assert (await held.titles())[-1] == f"kept-{k}"
        assert await held.pid() != pid


async def test_a_worker_that_stops_reading_loses_nobody(http):
    crew = await _crew(http, 3)
    deaf, teammates = crew[0], crew[1:]
    pid = await deaf.pid()
    assert (await deaf.call("stop_reading")).json()["result"]["deaf"]
    started = time.monotonic()
    r = await teammates[0].call("create_note", title="after-deafness")
    assert r.status_code == 200 and r.json()["ok"], r.text  # sent again on a fresh worker
    assert time.monotonic() - started < 2 * (CALL_TIMEOUT_S + 2.0) + 3.0
    assert _dead(pid)
    assert (await teammates[0].titles())[-2:] == ["kept-1", "after-deafness"]
    assert (await teammates[1].titles())[-1] == "kept-2"
    assert (await deaf.titles())[-1] == "kept-0"  # its call had completed: it moved on too


async def test_forks_keep_their_state_through_a_worker_loss(http, farm):
    """A fork cloned inside the worker, and one made through the front, hold in the front's
    copy exactly what their worker holds; both continue after the worker is killed."""
    parent = (await _crew(http, 1))[0]
    child = await parent.fork()  # same worker: cloned inside it
    assert (await child.call("create_note", title="child-only")).json()["ok"]
    for held in (parent, child):
        inst = farm.core.leases[held.id].instance
        asked = inst.worker.request({"op": "snapshot", "inst": inst.inst}, 10, cap=64 << 20)
        # on the farm's loop (its thread), where the worker's channel is watched
        done = asyncio.run_coroutine_threadsafe(asked, inst.worker._loop)
        _, actual = await asyncio.wrap_future(done)
        r = await held.http.get(held.path + "/snapshot", headers=held.auth)
        assert r.content == actual  # the front's copy is the worker's state, byte for byte
    pid = await parent.pid()
    worker = farm.core.leases[parent.id].instance.worker
    worker._loop.call_soon_threadsafe(worker.kill, "test: killed from outside")
    await asyncio.sleep(0.2)
    assert (await child.titles())[-2:] == ["kept-0", "child-only"]
    assert (await parent.titles())[-1] == "kept-0" and await parent.pid() != pid
    grandchild = await child.fork()
    assert (await grandchild.titles())[-2:] == ["kept-0", "child-only"]
