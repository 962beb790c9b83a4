"""The learning suite: the train / held-out split (unseen chains use only tools trained on; unseen
values come from chains trained on) and a small build through the gate, served by a farm."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from trainer.suite import Suite, SuiteConfig, build_suite, split_tasks


def _items() -> list[tuple[str, int, list[str]]]:
    tools = {"c0": ["a", "b"], "c1": ["b", "c"], "c2": ["a", "c"], "c3": ["d", "a"], "c4": ["a", "b", "c"],
             "c5": ["c", "a"], "c6": ["b"], "c7": ["e", "a"]}
    return [(chain, draw, t) for chain, t in tools.items() for draw in range(1 + (chain < "c5"))]


def test_held_out_chains_use_only_tools_trained_on() -> None:
    items = _items()
    split = split_tasks(items, 0.4, 0.5, "s")
    assert split == split_tasks(items, 0.4, 0.5, "s")  # deterministic under its seed
    train_tools = {t for (_, _, tools), s in zip(items, split) if s == "train" for t in tools}
    held = {chain for (chain, _, _), s in zip(items, split) if s == "heldout_chains"}
    assert held and "c3" not in held and "c7" not in held  # d and e: used by no other chain
    for (chain, _, tools), s in zip(items, split):
        if s == "heldout_chains":
            assert set(tools) <= train_tools
            assert all(s2 == "heldout_chains" for (c2, _, _), s2 in zip(items, split) if c2 == chain)


def test_held_out_values_leave_their_chain_in_training() -> None:
    items = _items()
    split = split_tasks(items, 0.2, 0.5, "s")
    by_chain = Counter(chain for (chain, _, _), s in zip(items, split) if s == "train")
    values = [chain for (chain, _, _), s in zip(items, split) if s == "heldout_values"]
    assert values and all(by_chain[chain] >= 1 for chain in values)
    assert len(values) == len(set(values))  # one draw of a chain, never all of them


@pytest.mark.slow
def test_a_small_suite_is_gated_split_and_served(tmp_path, bundled_catalog) -> None:
    from envfarm import load_catalog
    from cluster.compose import LocalFarm
    from envfarm.farm import FarmConfig, PoolConfig
    from trainer.episode import EpisodeConfig
    from trainer.policy import ScriptedPolicy
    from trainer.rollout import run_rollouts

    cfg = SuiteConfig(envs=["personal_banking_1"], chains=6, draws=2, heldout_chains=0.3,
                      heldout_values=0.5, dir=str(tmp_path / "suite"))
    lines: list[str] = []
    suite = build_suite(cfg, log=lines.append)
    counts = suite.manifest["counts"]
    assert sum(counts.values()) == len(suite.tasks) >= 4 and counts["train"] >= 2
    assert suite.manifest["writer"].startswith("template writer")
    assert json.loads(lines[0])["accepted"] == len(suite.tasks)
    catalog = load_catalog(suite.catalog)
    bundle = catalog["personal_banking_1"]
    first = len(bundled_catalog["personal_banking_1"].tasks)
    assert [t["task_idx"] for t in suite.tasks] == list(range(first, first + len(suite.tasks)))
    jobs = suite.jobs("train") + suite.jobs("heldout")
    assert sorted(jobs) == sorted(("personal_banking_1", t["task_idx"]) for t in suite.tasks)
    for t in suite.tasks:  # the request states every value of its reference calls
        for call in bundle.solutions[t["task_idx"]]:
            assert not call.arguments or json.dumps(call.arguments) in bundle.tasks[t["task_idx"]]

    async def play() -> tuple[list, list]:
        from envfarm.client import Farm

        async with Farm(farm.url) as client:
            solved = await run_rollouts(client, ScriptedPolicy.from_catalog(catalog), jobs,
                                        config=EpisodeConfig(tool_listing="names"))
            noop = []
            for env, idx in jobs:  # what the gate checked: the untouched database fails the verifier
                async with client.lease(env, task_idx=idx) as lease:
                    noop.append(await lease.verify(idx, "Done, I've taken care of that."))
        return solved, noop

    with LocalFarm(FarmConfig(catalog=str(suite.catalog), envs=suite.envs, pool=PoolConfig(warm=2))) as farm:
        solved, noop = asyncio.run(play())
    assert all(r.success for r in solved), [(r.task_idx, r.reason) for r in solved if not r.success]
    assert [v.outcome for v in noop] == ["agent_error"] * len(jobs), noop
    again = build_suite(cfg)  # cached: read back, not rebuilt
    assert isinstance(again, Suite) and again.tasks == suite.tasks
