"""Verify and snapshot floods (issue 34 §6): one tenant's flood waits behind itself.

Verifications of every tenant queued first come, first served in front of a verifier sandbox
that runs one or two at a time: a tenant that asked for 40 made another tenant's one wait for
all 40. They now take turns. A snapshot (and the database a verification reads) comes from the
front's copy of the lease's committed state: a flood of them never reaches a worker.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from envfarm.compose import LocalFarm
from envfarm.farm import FarmConfig, PoolConfig
from envfarm.models import Verifier
from tests.envfarm.worker.conftest import catalog
from tests.envfarm.worker.farm_api import KEYS, lease, two_tenants
from tests.envfarm.worker.tenancy_env import CODE

pytestmark = pytest.mark.slow
VERIFY_S = 0.25
SLOW_VERIFIER = f"""
import time

def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    time.sleep({VERIFY_S})
    return {{"result": "complete"}}
"""


@pytest.fixture(scope="module")
def farm():
    cat = catalog(tenancy=CODE)
    cat.bundles["tenancy"] = cat.bundles["tenancy"].model_copy(update={
        "code_verifiers": {0: Verifier(task_idx=0, code=SLOW_VERIFIER)}})
    tenants = two_tenants()
    farm = LocalFarm(FarmConfig(pool=PoolConfig(warm=2), call_timeout_s=2.0,
                                leases_per_worker=64, check_module_state=False,
                                tenants=tenants), catalog=cat).start(timeout_s=120)
    yield farm
    farm.stop()



async def _verify(held) -> tuple[float, dict]:
    started = time.monotonic()
    r = await held.http.post(held.path + "/verify", headers=held.auth, json={"task_idx": 0})
    assert r.status_code == 200, r.text
    return time.monotonic() - started, r.json()


async def test_a_verify_flood_does_not_stall_another_tenants_verification(http):
    flood = [await lease(http, "tenancy", KEYS["alpha"]) for _ in range(40)]
    other = await lease(http, "tenancy", KEYS["beta"])
    for held in (*flood, other):
        assert (await held.call("list_notes")).json()["ok"]
    flooding = [asyncio.create_task(_verify(held)) for held in flood]
    await asyncio.sleep(0.3)  # the flood is queued
    waited, verdict = await _verify(other)
    assert verdict["outcome"] == "completed", verdict
    # its turn came after at most a round of the flood's (2 at once), not after all 40
    assert waited < 10 * VERIFY_S, waited
    assert all(v["outcome"] == "completed" for _, v in await asyncio.gather(*flooding))


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_a_snapshot_flood_never_reaches_a_worker(http):
    """(Held before too, at a serialize and a pipe write per snapshot in the worker; now the
    worker is not asked at all.)"""
    attacker = await lease(http, "tenancy", KEYS["alpha"])
    assert (await attacker.call("create_note", title="flooded-state")).json()["ok"]
    pid = await attacker.pid()
    before = _cpu_s(pid)

    async def snapshot() -> bytes:
        r = await http.get(attacker.path + "/snapshot", headers=attacker.auth)
        assert r.status_code == 200
        return r.content

    images = await asyncio.gather(*(snapshot() for _ in range(300)))
    assert len(set(images)) == 1 and b"flooded-state" in images[0]
    assert _cpu_s(pid) - before < 0.05  # 300 x 260 KB and not a tick of the worker's CPU
