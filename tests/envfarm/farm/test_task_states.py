"""A task with a starting database of its own (EnvFactory's per-scenario state,
``gen_task_states.jsonl``): its leases start, reset and are verified from it, in process and in
env workers; other tasks' leases, and the next lease of a recycled instance, start from the env's."""

from __future__ import annotations

import json
import shutil

import pytest

from envfarm.catalog import BUNDLED_CATALOG, load_catalog
from envfarm.client import Farm
from envfarm.compose import LocalFarm
from envfarm.dbrows import table_rows
from envfarm.farm import FarmConfig, PoolConfig
from tests.envfarm.farm.conftest import ENV, farm_client

DROP = {"wishlists": [1, 2], "payment_methods": [3]}


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("states")
    shutil.copytree(BUNDLED_CATALOG / ENV, root / ENV)
    (root / "gen_task_states.jsonl").write_text(json.dumps(
        {"scenario": ENV, "task_idx": 5, "drop_rows": DROP}) + "\n")
    return root


def _missing(initial: bytes, template: bytes) -> dict[str, list[int]]:
    a, b = table_rows(template), table_rows(initial)
    return {t: sorted(set(a[t]) - set(b.get(t, {}))) for t in a if set(a[t]) - set(b.get(t, {}))}


async def test_leases_of_a_task_start_from_its_state_in_process(catalog_dir, make_core) -> None:
    catalog = load_catalog(catalog_dir)
    assert catalog[ENV].task_states == {5: DROP}
    from envfarm import EnvRuntime
    from envfarm.compose import compose_core

    runtime = EnvRuntime(catalog[ENV])
    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1)), catalog=catalog, runtimes={ENV: runtime})
    async with farm_client(core) as client:
        async def lease(task):
            info = (await client.post(f"/envs/{ENV}/leases", json={"task_idx": task})).json()
            return f"/envs/{ENV}/leases/{info['lease_id']}", {"Authorization": f"Bearer {info['token']}"}

        path, auth = await lease(5)
        initial = (await client.get(path + "/snapshot?which=initial", headers=auth)).content
        current = (await client.get(path + "/snapshot", headers=auth)).content
        assert _missing(initial, runtime.template.data) == DROP == _missing(current, runtime.template.data)
        r = await client.post(path + "/call", headers=auth, json={"tool": "list_payment_methods", "arguments": {}})
        assert [m["id"] for m in r.json()["result"]["payment_methods"]] == [1, 2]  # card 3 is not in this scenario
        await client.post(path + "/reset", headers=auth)
        assert _missing((await client.get(path + "/snapshot", headers=auth)).content, runtime.template.data) == DROP
        await client.delete(path, headers=auth)
        other, auth = await lease(4)  # the recycled instance is the env's again
        assert (await client.get(other + "/snapshot", headers=auth)).content == runtime.template.data


async def test_leases_of_a_task_start_from_its_state_in_workers(catalog_dir) -> None:
    with LocalFarm(FarmConfig(catalog=str(catalog_dir), envs=[ENV], pool=PoolConfig(warm=1))) as farm:
        async with Farm(farm.url) as sdk:
            plain = await sdk.acquire(ENV, task_idx=4)
            template = await plain.snapshot("initial")
            assert await plain.snapshot() == template
            lease = await sdk.acquire(ENV, task_idx=5)
            assert _missing(await lease.snapshot("initial"), template) == DROP
            assert _missing(await lease.snapshot(), template) == DROP
            methods = (await lease.call("list_payment_methods", {}))["payment_methods"]
            assert [m["id"] for m in methods] == [1, 2]
            await lease.reset()
            assert _missing(await lease.snapshot(), template) == DROP
            assert (await lease.verify()).valid  # judged against its own start
            await lease.release()
            await plain.release()


async def test_a_fork_keeps_the_task_state_and_a_quarantined_task_takes_no_fork(catalog_dir) -> None:
    """A fork is a new lease of the task: it starts from the parent's database now, its resets
    and its verifier's initial database are the task's own start; once the task is quarantined,
    a fork is refused like any new lease."""
    from envfarm import EnvRuntime
    from envfarm.compose import compose_core

    catalog = load_catalog(catalog_dir)
    runtime = EnvRuntime(catalog[ENV])
    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1)), catalog=catalog, runtimes={ENV: runtime})
    async with farm_client(core) as client:
        info = (await client.post(f"/envs/{ENV}/leases", json={"task_idx": 5})).json()
        path, auth = f"/envs/{ENV}/leases/{info['lease_id']}", {"Authorization": f"Bearer {info['token']}"}
        await client.post(path + "/call", headers=auth, json={"tool": "delete_payment_method",
                                                               "arguments": {"payment_method_id": 2}})
        child = (await client.post(path + "/fork", headers=auth, json={})).json()
        cpath = f"/envs/{ENV}/leases/{child['lease_id']}"
        cauth = {"Authorization": f"Bearer {child['token']}"}
        now = (await client.get(cpath + "/snapshot", headers=cauth)).content
        assert now == (await client.get(path + "/snapshot", headers=auth)).content
        assert _missing((await client.get(cpath + "/snapshot?which=initial", headers=cauth)).content,
                        runtime.template.data) == DROP
        await client.post(cpath + "/reset", headers=cauth)
        assert _missing((await client.get(cpath + "/snapshot", headers=cauth)).content, runtime.template.data) == DROP
        core.quarantine._put((ENV, 5), "test: put out of rotation", "errors")
        refused = await client.post(path + "/fork", headers=auth, json={})
        assert refused.status_code == 409 and refused.json()["error"]["type"] == "TaskQuarantined"
