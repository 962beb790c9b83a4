"""Issue 34 in Ray Serve mode: tenant placement, ordered release and blast radius one hold in a
Serve pool replica (the same ``FarmCore`` and workers), reached through the front app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.envfarm.serve.conftest import _start
from tests.fakes.toy_env import SAMPLE, SCHEMA
from tests.envfarm.worker.farm_api import KEYS, batch, gone, lease, two_tenants
from tests.envfarm.worker.tenancy_env import CODE

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ENV = "tenancy"


def _write_catalog(folder: Path) -> None:
    records = {
        "gen_scenario.jsonl": {"name": ENV, "description": "issue 34's hostile env"},
        "gen_tasks.jsonl": {"scenario": ENV, "tasks": ["noop"]},
        "gen_db.jsonl": {"scenario": ENV, "db_schema": SCHEMA, "db_path": f"{ENV}.db"},
        "gen_sample.jsonl": {"scenario": ENV, "sample_data": SAMPLE},
        "gen_envs.jsonl": {"scenario": ENV, "db_path": f"{ENV}.db", "full_code": CODE},
    }
    for name, record in records.items():
        (folder / name).write_text(json.dumps(record) + "\n")


@pytest.fixture(scope="module")
def serve_farm(tmp_path_factory) -> Iterator[object]:
    from envfarm.farm import FarmConfig, PoolConfig, free_port
    from envfarm.serve import DeploymentOptions, ServeOptions

    folder = tmp_path_factory.mktemp("tenancy_catalog")
    _write_catalog(folder)
    config = FarmConfig(catalog=str(folder), pool=PoolConfig(warm=2), call_timeout_s=1.5,
                        leases_per_worker=8, check_module_state=False, tenants=two_tenants())
    farm = _start(config, ServeOptions(port=free_port(), num_cpus=2,
                                       deployment=DeploymentOptions(num_replicas=1)))
    try:
        yield farm
    finally:
        farm.shutdown()


@pytest.fixture
async def http(serve_farm):
    async with httpx.AsyncClient(base_url=serve_farm.url, timeout=60) as client:
        yield client


async def test_tenants_never_share_a_worker_through_serve(http):
    alpha = [await lease(http, ENV, KEYS["alpha"]) for _ in range(2)]
    beta = [await lease(http, ENV, KEYS["beta"]) for _ in range(2)]
    alpha_pids = {await held.pid() for held in alpha}
    beta_pids = {await held.pid() for held in beta}
    assert len(alpha_pids) == 1 and len(beta_pids) == 1 and alpha_pids != beta_pids


async def test_only_the_guilty_lease_is_lost_through_serve(http):
    guilty, busy, idle = [await lease(http, ENV, KEYS["alpha"]) for _ in range(3)]
    assert (await idle.call("create_note", title="idle-state")).json()["ok"]
    writing = asyncio.create_task(busy.call("nap_then_note", seconds=0.6, title="in-flight"))
    await asyncio.sleep(0.1)
    r = await guilty.call("crash", after=0.2)
    assert r.status_code == 410 and gone(r.json()) == "lease_lost", r.text
    answer = await writing
    assert answer.status_code == 200 and answer.json()["ok"], answer.text
    assert (await busy.titles())[-1] == "in-flight"
    assert (await idle.titles())[-1] == "idle-state"


async def test_release_waits_for_the_call_in_flight_through_serve(http):
    first, second = await lease(http, ENV, KEYS["beta"]), await lease(http, ENV, KEYS["beta"])
    assert (await second.call("create_note", title="neighbour-state")).json()["ok"]
    pid = await second.pid()
    running = asyncio.create_task(batch(http, [first.item("nap", seconds=0.5),
                                               first.item("create_note", title="queued")]))
    await asyncio.sleep(0.2)
    assert (await first.release()).json()["status"] == "closed"
    napped, queued = await running
    assert napped["result"]["ok"] and gone(queued) == "closed", (napped, queued)
    assert "neighbour-state" in await second.titles() and await second.pid() == pid
