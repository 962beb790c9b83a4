"""Branching rollouts: a prefix forked into k branches that form one GRPO group."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from envfarm.compose import compose_core
from envfarm.client import ASGITransport, Farm
from envfarm.farm import FarmConfig, PoolConfig, Tenant, TenantsConfig, build_app, hash_key
from judge import Message
from trainer.branching import run_branches
from trainer.config import TrainConfig
from trainer.episode import EpisodeConfig
from trainer.format import final_text
from trainer.policy import Generation, ScriptedPolicy, TurnContext
from trainer.train import Trainer
from trainer.grpo import group_advantages
from tests.envfarm.farm.conftest import lifespan_running
from tests.trainer.conftest import leased

ENV, TASK = "hotel_booking_1", 4  # list_tools, search, create_wishlist, add x2, answer


class Fork:
    """The reference solution up to the branch point; there, branch by branch in the order
    they ask, one follows it to the end and the next gives up (answers at once)."""

    def __init__(self, guide: ScriptedPolicy, at_turn: int) -> None:
        self.guide, self.at_turn = guide, at_turn
        self.asked = 0

    async def generate(self, messages: Sequence[Message], ctx: TurnContext) -> Generation:
        if ctx.turn < self.at_turn:
            return await self.guide.generate(messages, ctx)
        if ctx.turn == self.at_turn:
            self.asked += 1
            if self.asked % 2 == 0:
                return Generation(text=final_text("I could not do it.", "I give up."),
                                  policy="quitter")
        return await self.guide.generate(messages, ctx)


async def test_k_branches_share_a_prefix_and_form_one_group(farm, farm_core, bundled_catalog):
    guide = ScriptedPolicy.from_catalog(bundled_catalog)
    at = 3  # after list_tools, search, create_wishlist
    policy = Fork(guide, at)
    results = await run_branches(farm, policy, ENV, TASK, k=4, at_turn=at,
                                 config=EpisodeConfig(window=None))
    assert len(results) == 4 and policy.asked == 4
    rewards = sorted(r.reward for r in results)
    assert rewards == [0.0, 0.0, 1.0, 1.0]
    # each branch was judged on the whole episode, and trains only on its own turns
    for r in results:
        assert r.details["branched_at"] == at
        assert sum(m.role == "assistant" for m in r.trajectory.messages) == at + len(r.turns)
        assert all(t.generation.policy in ("scripted", "quitter") for t in r.turns)
    assert len({r.lease_id for r in results}) == 4
    assert leased(farm_core) == 0  # the prefix's lease and every fork given back
    # one group: the finishers' advantage positive, the quitters' negative
    advs = group_advantages([r.reward for r in results])
    assert sorted(a > 0 for a in advs) == [False, False, True, True]


async def test_a_prefix_that_ends_early_is_a_group_of_one(farm, farm_core, bundled_catalog):
    guide = ScriptedPolicy.from_catalog(bundled_catalog)
    steps = len(bundled_catalog[ENV].solutions[TASK])
    results = await run_branches(farm, guide, ENV, TASK, k=4, at_turn=steps + 5)
    assert len(results) == 1 and results[0].reward == 1.0
    assert len(results[0].turns) == steps + 2  # list_tools, the calls, the answer: one episode
    assert leased(farm_core) == 0


async def test_forks_refused_over_quota_make_a_smaller_true_group(bundled_catalog, runtimes):
    key = "efk_branching"
    tenants = TenantsConfig(require_key=True, tenants=[
        Tenant(name="t", key_sha256=hash_key(key), max_leases=2)])
    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2), tenants=tenants),
                        catalog=bundled_catalog, runtimes={ENV: runtimes[ENV]})
    app = build_app(core)
    guide = ScriptedPolicy.from_catalog(bundled_catalog)
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app),
                                            api_key=key, retries=0) as farm:
        results = await run_branches(farm, guide, ENV, TASK, k=4, at_turn=2)
    assert len(results) == 2 and all(r.reward == 1.0 for r in results)
    assert core.tenants.usage["t"].leases == 0


async def test_the_trainer_makes_its_groups_by_branching(farm, farm_core, bundled_catalog):
    """``branch_at`` in the config: ``Trainer._group`` returns the branches of one episode (a
    Trainer without its model: the group is made before any model is touched)."""
    trainer = object.__new__(Trainer)
    trainer.cfg = TrainConfig(branch_at=3, group_size=2, envs=[ENV])
    trainer.policy = Fork(ScriptedPolicy.from_catalog(bundled_catalog), 3)
    trainer.episode_cfg = EpisodeConfig(window=None)
    group = await trainer._group(farm, asyncio.Semaphore(4), ENV, TASK)
    assert sorted(r.reward for r in group) == [0.0, 1.0]
    assert all(r.details["branched_at"] == 3 for r in group) and leased(farm_core) == 0
