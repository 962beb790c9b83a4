"""Per-scenario starting state (EnvFactory §3.3): each chain's scenario starts from a database of
its own, its verifier compares against it, the export records it and the farm serves the task
from it."""

from __future__ import annotations

import asyncio

import pytest

from envfarm import EnvRuntime, load_catalog
from envfarm.compose import compose_core
from envfarm.dbrows import table_rows
from envfarm.farm import FarmConfig, PoolConfig
from synth.factory.chains import sample_chains
from synth.factory.consistent import relations
from synth.factory.dbvalues import db_columns, foreign_keys
from synth.factory.export import export_env
from synth.factory.graph import build_graph
from synth.factory.scenario import scenario_drop, scenario_state
from tests.envfarm.farm.conftest import farm_client
from tests.fakes.factory_agent import ScriptedWorld
from tests.synth.test_factory_integrity import _episodes

ENV = "hotel_booking_1"


@pytest.fixture(scope="module")
def hotel() -> EnvRuntime:
    return EnvRuntime(load_catalog()[ENV])


def test_two_scenarios_start_from_different_consistent_databases(hotel) -> None:
    data, code = hotel.template.data, hotel.bundle.code
    drop_a, state_a = scenario_state(data, code, "scenario-a")
    drop_b, state_b = scenario_state(data, code, "scenario-b")
    assert drop_a and drop_b and drop_a != drop_b and state_a != state_b
    assert scenario_drop(data, code, "scenario-a") == drop_a  # the same scenario, the same world
    user_table, user = relations(data, code).user
    for state in (state_a, state_b):
        rows = table_rows(state)
        assert user in rows[user_table].values()  # the acting user is always there
        for table, column, ref_table, ref_column in foreign_keys(data):  # no key left dangling
            targets = {r.get(ref_column) for r in rows[ref_table].values()}
            assert all(r.get(column) in targets for r in rows[table].values() if r.get(column) is not None), \
                (table, column, ref_table)


def test_episodes_carry_their_scenario_and_the_farm_serves_it(hotel, mock_openai, sandbox, tmp_path) -> None:
    graph = asyncio.run(build_graph(hotel, embedder=None))
    chains = sample_chains(graph, db_columns(hotel.template.data), n=30, max_len=3, seed=0)[5:7]
    ScriptedWorld().install(mock_openai)
    eps = _episodes(hotel, chains, mock_openai, sandbox)
    accepted = [e for e in eps if e.accepted]
    assert len(accepted) == 2, [(e.reason, e.detail) for e in eps]
    assert all(e.task_state for e in accepted) and accepted[0].task_state != accepted[1].task_state

    catalog = load_catalog()
    export_env(catalog, ENV, tmp_path, accepted)
    served = load_catalog(tmp_path / "factory_catalog")
    first = len(catalog[ENV].tasks)
    assert served[ENV].task_states == {first: accepted[0].task_state, first + 1: accepted[1].task_state}
    runtime = EnvRuntime(served[ENV])
    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1)), catalog=served, runtimes={ENV: runtime})

    async def play(client, idx):
        info = (await client.post(f"/envs/{ENV}/leases", json={"task_idx": idx})).json()
        path, auth = f"/envs/{ENV}/leases/{info['lease_id']}", {"Authorization": f"Bearer {info['token']}"}
        initial = (await client.get(path + "/snapshot?which=initial", headers=auth)).content
        for step in served[ENV].solutions[idx]:
            assert (await client.post(path + "/call", headers=auth,
                                      json={"tool": step.tool, "arguments": step.arguments})).json()["ok"]
        verdict = (await client.post(path + "/verify", headers=auth,
                                     json={"final_answer": served[ENV].solution_answers.get(idx)})).json()
        return initial, verdict["reward"]

    async def main():
        async with farm_client(core) as client:
            return [await play(client, first + i) for i in range(2)]

    (initial_a, reward_a), (initial_b, reward_b) = asyncio.run(main())
    assert initial_a != initial_b != hotel.template.data
    assert (reward_a, reward_b) == (1.0, 1.0)  # each reference passes from its own start
