"""Quarantine while serving, through HTTP: a task whose episodes keep failing on the env's side
(env errors, invalid verdicts) or that the catalog flagged at load takes no new lease (a typed
409 saying why) until an operator lifts it; /quarantine, /metrics and /status.json show it."""

from __future__ import annotations

import pytest

from envfarm import EnvRuntime
from envfarm.client import ASGITransport, Farm, TaskQuarantined
from envfarm.compose import compose_core
from envfarm.farm import FarmConfig, PoolConfig, Quarantine, QuarantineConfig, build_app
from envfarm.models import Verifier
from tests.envfarm.farm.conftest import ENV, farm_client, lifespan_running, new_lease
from tests.envfarm.farm.test_env_errors import BOOM

STRICT = QuarantineConfig(min_calls=4, max_env_error_share=0.5, min_verifications=3, max_invalid_share=0.5)
BROKEN_VERIFIER = '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    raise RuntimeError("this verifier is broken")
'''


@pytest.fixture(scope="module")
def catalog(bundled_catalog):
    """The hotel env with a tool that always crashes, task 1's verifier broken, task 2 flagged."""
    bundle = bundled_catalog[ENV]
    bundle = bundle.model_copy(update={
        "code": bundle.code + BOOM,
        "code_verifiers": {**bundle.code_verifiers, 1: Verifier(task_idx=1, task=bundle.tasks[1],
                                                                code=BROKEN_VERIFIER)},
        "flagged": {2: "code path: echo passes"}})
    return type(bundled_catalog)({**bundled_catalog.bundles, ENV: bundle}, bundled_catalog.problems,
                                 bundled_catalog.root), EnvRuntime(bundle)


def _core(catalog, quarantine: QuarantineConfig = STRICT):
    catalog, runtime = catalog
    return compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1), quarantine=quarantine),
                        catalog=catalog, runtimes={ENV: runtime})


async def _boom(client, path, auth) -> None:
    r = await client.post(path + "/call", headers=auth, json={"tool": "boom_now", "arguments": {}})
    assert r.json()["error"]["kind"] == "env_error"


async def test_env_errors_quarantine_a_task_until_lifted(catalog, bundled_catalog) -> None:
    async with farm_client(_core(catalog)) as client:
        path, auth, _ = await new_lease(client, task_idx=0)
        ok = bundled_catalog[ENV].solutions[0][0]
        r = await client.post(path + "/call", headers=auth, json={"tool": ok.tool, "arguments": ok.arguments})
        assert r.json()["ok"]
        for _ in range(3):  # 3 of 4 calls fail on the env's side: over half
            await _boom(client, path, auth)
        refused = await client.post(f"/envs/{ENV}/leases", json={"task_idx": 0})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert (error["type"], error["kind"], error["task_idx"]) == ("TaskQuarantined", "quarantined", 0)
        assert "3 of 4 tool calls failed on the env's side" in error["message"]
        assert (await client.post(f"/envs/{ENV}/leases", json={"task_idx": 3})).status_code == 201
        listed = (await client.get("/quarantine")).json()
        assert [(q["task_idx"], q["source"]) for q in listed] == [(0, "errors"), (2, "flagged")]
        metrics = (await client.get("/metrics")).text
        quarantined = {line.split('scope="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                       for line in metrics.splitlines() if line.startswith("envfarm_quarantined{")}
        assert quarantined == {"task": 2.0, "env": 0.0}
        assert any(line.startswith("envfarm_quarantine_events_total{") and 'event="refused"' in line
                   and line.endswith(" 1.0") for line in metrics.splitlines()), metrics
        status = (await client.get("/status.json")).json()
        assert [q["task_idx"] for q in status["quarantined"]] == [0, 2]
        lifted = await client.post("/quarantine/lift", json={"env": ENV, "task_idx": 0})
        assert [q["task_idx"] for q in lifted.json()] == [0]
        assert (await client.post(f"/envs/{ENV}/leases", json={"task_idx": 0})).status_code == 201
        # the lease already out keeps its episode
        assert (await client.post(path + "/verify", headers=auth)).status_code == 200


async def test_invalid_verdicts_quarantine_a_task(catalog) -> None:
    async with farm_client(_core(catalog)) as client:
        for _ in range(3):
            path, auth, _ = await new_lease(client, task_idx=1)
            verdict = (await client.post(path + "/verify", headers=auth)).json()
            assert verdict["outcome"] == "invalid" and verdict["error_kind"] == "verifier_error"
            await client.delete(path, headers=auth)
        refused = (await client.post(f"/envs/{ENV}/leases", json={"task_idx": 1})).json()["error"]
        assert refused["type"] == "TaskQuarantined"
        assert "3 of 3 verifications gave no verdict" in refused["reason"]


async def test_a_flagged_task_is_quarantined_at_load_and_the_sdk_says_why(catalog) -> None:
    app = build_app(_core(catalog))
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app)) as farm:
        (flagged,) = await farm.quarantined()
        assert (flagged.env, flagged.task_idx, flagged.source) == (ENV, 2, "flagged")
        assert "echo passes" in flagged.reason
        with pytest.raises(TaskQuarantined) as caught:
            await farm.acquire(ENV, task_idx=2)
        assert caught.value.task_idx == 2 and "echo passes" in caught.value.message
        assert [q.task_idx for q in await farm.lift_quarantine(ENV, 2)] == [2]
        assert await farm.quarantined() == []
        lease = await farm.acquire(ENV, task_idx=2)
        await lease.release()


async def test_flags_can_be_ignored_and_counting_switched_off(catalog) -> None:
    core = _core(catalog, QuarantineConfig(enabled=False))
    async with farm_client(core) as client:
        path, auth, _ = await new_lease(client, task_idx=2)
        for _ in range(8):
            await _boom(client, path, auth)
        assert (await client.get("/quarantine")).json() == []
        assert (await client.post(f"/envs/{ENV}/leases", json={"task_idx": 2})).status_code == 201


def test_one_bad_task_is_its_own_fault_two_are_the_env_types() -> None:
    clock = [1000.0]
    q = Quarantine(STRICT, "o", clock=lambda: clock[0])
    for _ in range(4):
        q.record_call("e", 0, bad=True)
    assert [(x.env, x.task_idx) for x in q.listing()] == [("e", 0)]
    for _ in range(2):
        q.record_call("e", 5, bad=True)   # the env type's counts: 3 bad of task 0's, 2 of task 5's
    assert [(x.env, x.task_idx) for x in q.listing()] == [("e", None), ("e", 0)]
    with pytest.raises(TaskQuarantined):
        q.admit("e", 7)  # every task of a quarantined env type
    q.lift("e")
    assert q.listing() == [] and q.events == {"quarantined": 2, "lifted": 2, "refused": 1}


def test_counts_leave_the_window() -> None:
    clock = [1000.0]
    q = Quarantine(QuarantineConfig(window_s=60, min_calls=4), "o", clock=lambda: clock[0])
    for _ in range(3):
        q.record_call("e", 0, bad=True)
    clock[0] += 61  # those three are out of the window
    for _ in range(3):
        q.record_call("e", 0, bad=False)
    q.record_call("e", 0, bad=True)
    assert q.listing() == []  # 1 bad of 4 in the window
