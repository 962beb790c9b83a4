"""The front distrusts every byte from a worker (issue 34 §4, §6), attacked through HTTP.

Env code writes frames of its own into the channel, or lifts the worker's own answer cap. The
front parsed a frame's JSON header before checking the request id (a 60 MiB nested header:
+1.5 GiB of RSS, another tenant stalled for seconds; 200k deep: a RecursionError out of the
reader, the worker caught only at the deadline) and relayed what a worker lifted its cap to.
Now a header is bounded before it is parsed, a reply is admitted by its request id and caps
before its body is read, and the worker is killed at once: the lease whose call did it is lost
(typed 410), its teammates on that worker carry on, the front's memory and other tenants'
calls do not notice.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

import pytest

from tests.envfarm.worker.conftest import start_farm
from tests.envfarm.worker.farm_api import KEYS, gone, lease, two_tenants
from tests.envfarm.worker.tenancy_env import CODE

pytestmark = pytest.mark.slow
CALL_TIMEOUT_S = 5.0
#: What the front may grow by while it refuses a 60 MiB frame (it used to hold GiBs).
RSS_SLACK_KB = 100 << 10
#: The longest another tenant's call may take meanwhile (it used to wait for seconds).
BYSTANDER_MAX_S = 1.0


@pytest.fixture(scope="module")
def farm():
    tenants = two_tenants()
    farm = start_farm({"tenancy": CODE, "other": CODE}, call_timeout_s=CALL_TIMEOUT_S,
                      leases_per_worker=8, check_module_state=False, tenants=tenants,
                      spare_workers=2)
    yield farm
    farm.stop()



def _peak_rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


@asynccontextmanager
async def watched(http):
    """The front's peak RSS growth and another tenant's slowest call while the block runs
    (the farm's front is this process: a thread of it)."""
    bystander = await lease(http, "other", KEYS["beta"])
    seen = {"rss_kb": 0, "slowest_s": 0.0}
    stop = asyncio.Event()

    async def keep_calling() -> None:
        while not stop.is_set():
            started = time.monotonic()
            assert (await bystander.call("list_notes")).json()["ok"]
            seen["slowest_s"] = max(seen["slowest_s"], time.monotonic() - started)
            await asyncio.sleep(0.01)

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS starts again from now
    before = _peak_rss_kb()
    calling = asyncio.create_task(keep_calling())
    try:
        yield seen
    finally:
        stop.set()
        await calling
        seen["rss_kb"] = _peak_rss_kb() - before


async def _team(http):
    """The attacker and a teammate (same tenant, same worker), the teammate with state."""
    attacker, teammate = await lease(http, "tenancy", KEYS["alpha"]), \
        await lease(http, "tenancy", KEYS["alpha"])
    assert await attacker.pid() == await teammate.pid()
    assert (await teammate.call("create_note", title="teammate-state")).json()["ok"]
    return attacker, teammate


async def _teammate_carries_on(teammate, dead_pid: int) -> None:
    assert "teammate-state" in await teammate.titles()  # not lost: moved, state kept
    assert await teammate.pid() != dead_pid


@pytest.mark.parametrize("kind", ["nested_header", "unsolicited_big", "big_answer_own_id"])
async def test_a_60_mib_frame_is_refused_by_its_header(http, kind):
    attacker, teammate = await _team(http)
    pid = await attacker.pid()
    async with watched(http) as seen:
        r = await attacker.call("forge_frames", kind=kind)
    assert r.status_code == 410 and gone(r.json()) == "lease_lost", r.text[:500]
    assert seen["rss_kb"] < RSS_SLACK_KB, seen
    assert seen["slowest_s"] < BYSTANDER_MAX_S, seen
    await _teammate_carries_on(teammate, pid)


async def test_a_header_200k_deep_is_a_protocol_error_not_a_wait_for_the_deadline(http):
    attacker, teammate = await _team(http)
    pid = await attacker.pid()
    started = time.monotonic()
    r = await attacker.call("forge_frames", kind="deep_header")
    assert r.status_code == 410 and gone(r.json()) == "lease_lost", r.text[:500]
    # killed when the header came (twice: among others, then alone), not at the deadline
    assert time.monotonic() - started < CALL_TIMEOUT_S
    await _teammate_carries_on(teammate, pid)


async def test_the_answer_cap_holds_when_env_code_lifts_the_workers(http):
    attacker, teammate = await _team(http)
    pid = await attacker.pid()
    async with watched(http) as seen:
        r = await attacker.call("huge_uncapped", mib=60)
    assert r.status_code == 410 and gone(r.json()) == "lease_lost", r.text[:500]
    assert seen["rss_kb"] < RSS_SLACK_KB, seen
    assert seen["slowest_s"] < BYSTANDER_MAX_S, seen
    await _teammate_carries_on(teammate, pid)


async def test_a_flood_of_answers_to_its_own_call_ends_at_the_second(http):
    """Env code may answer its own call as it likes (the first answer is the answer); every
    answer after it is one to nothing in flight: the worker is killed at the first, nobody's
    lease is lost."""
    attacker, teammate = await _team(http)
    pid = await attacker.pid()
    async with watched(http) as seen:
        r = await attacker.call("forge_frames", kind="duplicate", count=20_000)
    assert r.status_code == 200 and r.json()["result"] == "forged", r.text[:500]
    assert seen["slowest_s"] < BYSTANDER_MAX_S, seen
    await _teammate_carries_on(teammate, pid)
    assert (await attacker.call("list_notes")).json()["ok"]  # it moved on too
