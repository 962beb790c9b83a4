"""Rollouts only (no training): run the agent loop over tasks, write trajectories + rewards.

This is how a model is evaluated on a catalog: success rate per env and overall.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envfarm.client import Farm
from trainer.episode import EpisodeConfig, EpisodeResult, run_episode
from trainer.policy import Policy


@dataclass
class EnvScore:
    env: str
    episodes: int = 0
    valid: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    format_errors: int = 0

    @property
    def success_rate(self) -> float | None:
        return self.successes / self.valid if self.valid else None

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.valid if self.valid else None

    def add(self, r: EpisodeResult) -> None:
        self.episodes += 1
        self.format_errors += r.outcome == "format_error"
        if r.valid and r.reward is not None:
            self.valid += 1
            self.successes += r.success
            self.reward_sum += r.reward


def scores(results: Sequence[EpisodeResult]) -> dict[str, EnvScore]:
    """Per env, plus ``"overall"``."""
    out: dict[str, EnvScore] = {}
    for r in results:
        out.setdefault(r.env, EnvScore(r.env)).add(r)
        out.setdefault("overall", EnvScore("overall")).add(r)
    return out


async def run_rollouts(farm: Farm, policy: Policy, jobs: Sequence[tuple[str, int]], *,
                       concurrency: int = 16, config: EpisodeConfig | None = None,
                       out: Path | None = None,
                       on_done: Callable[[EpisodeResult], Any] | None = None
                       ) -> list[EpisodeResult]:
    """One episode per (env, task_idx), at most ``concurrency`` at once; each result is
    appended to ``out`` (JSONL) as soon as it is known."""
    gate = asyncio.Semaphore(concurrency)
    sink = out.open("w", encoding="utf-8") if out else None

    async def one(env: str, idx: int) -> EpisodeResult:
        async with gate:
            result = await run_episode(farm, policy, env, idx, config=config)
        if sink:
            sink.write(json.dumps(result.summary()) + "\n")
            sink.flush()
        if on_done:
            on_done(result)
        return result

    try:
        return list(await asyncio.gather(*(one(env, idx) for env, idx in jobs)))
    finally:
        if sink:
            sink.close()
