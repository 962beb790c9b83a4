"""Branching rollouts: one episode up to turn ``t``, forked into ``k`` branches that go on from
there; the ``k`` branches form one GRPO group.

    results = await run_branches(farm, policy, env, task_idx, k=8, at_turn=3)

The prefix runs once (its turns cost one rollout, not ``k``); then ``k - 1`` forks of its lease
(``Lease.fork``: the database at that moment, a copy of its bytes) and the lease itself carry on,
each with a copy of the conversation so far. Every branch is judged on the whole episode (the
judge sees the prefix too); training uses only each branch's own turns, since turns all branches
share get advantages that sum to zero across the group. If the prefix ends or fails before turn
``t`` the group is that one episode (no signal, like any group of one). ``TrainConfig.branch_at``
turns it on in the trainer (``group_size`` = ``k``).
"""

from __future__ import annotations

import asyncio

from envfarm.client import EnvfarmError, Farm, Lease
from trainer.episode import EpisodeConfig, EpisodeResult, run_prefix
from trainer.policy import Policy


async def run_branches(farm: Farm, policy: Policy, env: str, task_idx: int | None, *, k: int,
                       at_turn: int, config: EpisodeConfig | None = None,
                       lease: Lease | None = None) -> list[EpisodeResult]:
    """The ``k`` branches of one episode forked after ``at_turn`` turns (fewer where the farm
    refused a fork: those branches are missing from the group, never faked). Every lease is
    released however the branches end."""
    if k < 1 or at_turn < 0:
        raise ValueError("k >= 1 branches from a turn >= 0")
    if lease is None:
        lease = await farm.acquire(env, task_idx=task_idx)
    forks: list[Lease] = []
    try:
        root = await run_prefix(farm, policy, env, task_idx, at_turn, lease=lease,
                                config=config)
        if root.reached:
            for _ in range(k - 1):
                try:
                    forks.append(await lease.fork())
                except EnvfarmError:
                    break  # over quota, pool full: a smaller group, still a true one
    except BaseException:  # cancelled (or a bug) before the branches own their leases
        await asyncio.gather(*(_release(x) for x in [lease, *forks]))
        raise
    if not root.reached:
        return [await root.run(lease, start=at_turn)]
    branches = [root] + [root.branch() for _ in forks]  # copies before anyone moves on
    results = await asyncio.gather(*(branch.run(own, start=at_turn)
                                      for branch, own in zip(branches, [lease, *forks])))
    for result in results:
        result.turns = result.turns[at_turn:]  # trained: each branch's own turns
        result.details["branched_at"] = at_turn
    return list(results)


async def _release(lease: Lease) -> None:
    try:
        await asyncio.shield(lease.release())
    except (EnvfarmError, asyncio.CancelledError):
        pass  # gone already, or we are cancelled: the shielded release still completes
