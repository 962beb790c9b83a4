"""The training loop, without Ray: rollouts against the farm, GRPO update, metrics, checkpoints.

``trainer.actor.TrainerActor`` runs this same ``Trainer`` inside a Ray actor; ``envfarm train
--no-ray`` runs it in the calling process. Per step: pick ``batch_size`` tasks, lease ``G``
instances per task in one batched request, run every episode concurrently (bounded), turn each
assistant turn into a sample carrying its episode's group-relative advantage, update, log,
checkpoint. A restarted trainer continues at the step after its last checkpoint.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import time
from pathlib import Path
from typing import Any

from envfarm import load_catalog
from envfarm.client import EnvfarmError, Farm
from judge import Outcome
from trainer import checkpoint, judging, metrics
from trainer.batched import BatchedPolicy
from trainer.branching import run_branches
from trainer.config import TrainConfig
from trainer.episode import EpisodeConfig, EpisodeResult, TurnRecord, run_episode
from trainer.format import system_text
from trainer.grpo import (
    GRPOConfig,
    Sample,
    group_advantages,
    grpo_step,
    step_advantages,
)
from trainer.hf import HFPolicy, encode_completion, encode_prompt, load_model
from trainer.policy import FINISH_STOP, Policy, ScriptedPolicy


class Trainer:
    """Owns the policy model, its reference copy and the optimizer."""

    def __init__(self, config: TrainConfig, farm_url: str) -> None:
        import torch

        self.cfg = config
        self.farm_url = farm_url
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = self.out / "checkpoints"
        self.metrics_path = self.out / "metrics.jsonl"
        self.plot_path = self.out / "plot.png"
        torch.manual_seed(config.seed)
        if config.threads:
            torch.set_num_threads(config.threads)
        base = Path(config.model) if config.model else _tiny()
        resume = checkpoint.latest(self.ckpt_dir)
        # fp32 master weights by default, whatever dtype the checkpoint was saved in
        self.model, self.tokenizer = load_model(resume or base, config.device,
                                                dtype=config.param_dtype)
        self.ref = None
        if config.kl_coef > 0:  # the reference is the starting model, also after a resume
            self.ref = (load_model(base, config.device, dtype=config.param_dtype)[0] if resume
                        else copy.deepcopy(self.model))
            self.ref.eval().requires_grad_(False)
        if config.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr,
                                           weight_decay=0.0)
        self.step = 0  # the next step to run
        if resume is not None:
            checkpoint.restore_optimizer(resume, self.optimizer)
            self.step = checkpoint.step_of(resume) + 1
            metrics.keep_until(self.metrics_path, self.step - 1)
        elif self.metrics_path.exists():
            self.metrics_path.unlink()  # a fresh run: no stale steps in the log
        self.policy: Any = (
            BatchedPolicy(self.model, self.tokenizer, max_new_tokens=config.max_new_tokens,
                          temperature=config.temperature, seed=config.seed,
                          max_batch=config.max_batch) if config.batched else
            HFPolicy(self.model, self.tokenizer, max_new_tokens=config.max_new_tokens,
                     temperature=config.temperature))
        catalog = load_catalog(config.catalog)
        self.guide = ScriptedPolicy.from_catalog(catalog)
        self.tasks = self._task_list(catalog)
        self.judge = judging.from_config(config, catalog)  # None on the code path
        self.episode_cfg = EpisodeConfig(max_turns=config.max_turns, window=config.window,
                                         tool_listing=config.tool_listing,
                                         max_tool_chars=config.max_tool_chars,
                                         system=system_text(config.system), judge=self.judge)
        self.grpo_cfg = grpo_config(config)

    def _task_list(self, catalog: Any) -> list[tuple[str, int]]:
        if self.cfg.jobs is not None:
            return [(catalog[env].name, idx) for env, idx in self.cfg.jobs]
        envs = self.cfg.envs or catalog.servable
        tasks = []
        for env in envs:
            bundle = catalog[env]
            for idx in sorted(bundle.code_verifiers):
                if self.cfg.tasks is not None and idx not in self.cfg.tasks:
                    continue
                if self.cfg.guide_fraction and idx not in bundle.solutions:
                    continue  # a guided group needs a reference solution to replay
                tasks.append((bundle.name, idx))
        if not tasks:
            raise ValueError("no task to train on: check envs/tasks (each needs a code-mode "
                             "verifier, and a reference solution when guide_fraction > 0)")
        return tasks

    @property
    def done(self) -> bool:
        return self.step >= self.cfg.steps

    def pick_tasks(self, step: int, skip: set[tuple[str, int | None]] = frozenset()) -> list[tuple[str, int]]:
        return pick_tasks(self.tasks, self.cfg.batch_size, self.cfg.seed * 1_000_003 + step, skip)

    async def train_step(self) -> dict[str, Any]:
        """One GRPO step; returns (and logs) its metrics."""
        step = self.step
        started = time.perf_counter()
        groups = await self.rollouts(step)
        rollout_s = time.perf_counter() - started
        t = time.perf_counter()
        await judging.settle([e for g in groups for e in g], self.judge)
        judge_wait_s = time.perf_counter() - t  # judging not hidden behind the rollouts
        samples, used = self._samples(groups)
        t = time.perf_counter()
        self.grpo_cfg.seed = self.cfg.seed * 1_000_003 + step  # mini-batch shuffling
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.lr_at(step)
        stats = await asyncio.to_thread(grpo_step, self.model, self.ref, self.optimizer,
                                        samples, self.tokenizer.pad_token_id, self.grpo_cfg)
        update_s = time.perf_counter() - t
        episodes = [e for g in groups for e in g]
        record = {"step": step, **metrics.episode_metrics(episodes, rollout_s),
                  "groups": len(groups), "groups_used": used,
                  "by_temperature": metrics.by_temperature(episodes),
                  "groups_lost": sum(1 for g in groups if not g),
                  "update_s": update_s, "judge_wait_s": judge_wait_s,
                  "lr": self.optimizer.param_groups[0]["lr"],
                  "step_s": time.perf_counter() - started,
                  **{f"update_{k}": v for k, v in stats.items()}}
        metrics.append(self.metrics_path, record)
        metrics.plot(metrics.read(self.metrics_path), self.plot_path)
        if (step + 1) % self.cfg.checkpoint_every == 0 or step + 1 >= self.cfg.steps:
            checkpoint.save(self.ckpt_dir, step, self.model, self.tokenizer, self.optimizer,
                            extra={"metrics": record}, keep=self.cfg.keep_checkpoints)
        self.step = step + 1
        return record

    async def rollouts(self, step: int) -> list[list[EpisodeResult]]:
        """Step ``step``'s groups of rollouts by the current model (what ``train_step`` learns
        from; an empty group: the farm could not lease it)."""
        gate = asyncio.Semaphore(self.cfg.concurrency)
        async with Farm(self.farm_url, max_connections=max(64, self.cfg.concurrency),
                        direct=self.cfg.farm_direct) as farm:
            tasks = self.pick_tasks(step, await quarantined(farm))
            return list(await asyncio.gather(*(self._group(farm, gate, env, idx, (step, k))
                                               for k, (env, idx) in enumerate(tasks))))

    async def _group(self, farm: Farm, gate: asyncio.Semaphore, env: str, task_idx: int,
                     key: tuple[int, int] = (0, 0)) -> list[EpisodeResult]:
        """G rollouts of one task on G instances leased in one request (branching mode: G
        branches of one episode, ``trainer.branching``)."""
        g = self.cfg.group_size
        if self.cfg.branch_at is not None:
            async with gate:
                try:
                    return await run_branches(farm, self.policy, env, task_idx, k=g,
                                              at_turn=self.cfg.branch_at,
                                              config=self.episode_cfg)
                except EnvfarmError:
                    return []
        try:
            leases = await farm.acquire_many(env, g, task_idx=task_idx)
        except EnvfarmError:
            return []  # the farm could not give us the group: the step goes on without it
        guides = round(g * self.cfg.guide_fraction)
        policies: list[Policy] = [self.guide] * guides + [self.policy] * (g - guides)

        async def one(policy: Policy, lease: Any, member: int) -> EpisodeResult:
            async with gate:
                if isinstance(policy, BatchedPolicy):  # a row of the step's lockstep batches
                    async with policy.episode((*key, member), self.cfg.temperature_of(member)):
                        return await run_episode(farm, policy, env, task_idx, lease=lease,
                                                 config=self.episode_cfg)
                return await run_episode(farm, policy, env, task_idx, lease=lease,
                                         config=self.episode_cfg)

        return list(await asyncio.gather(*(one(p, lease, m) for m, (p, lease)
                                           in enumerate(zip(policies, leases)))))

    def _samples(self, groups: list[list[EpisodeResult]]) -> tuple[list[Sample], int]:
        return rollout_samples(groups, self.tokenizer)


def pick_tasks(tasks: list[tuple[str, int]], batch_size: int, seed: int,
               skip: set[tuple[str, int | None]] = frozenset()) -> list[tuple[str, int]]:
    """``batch_size`` tasks drawn under ``seed``, none of them quarantined (``skip``: (env,
    task_idx), task_idx None for a whole env type); [] when every task is."""
    pool = [t for t in tasks if t not in skip and (t[0], None) not in skip]
    rng = random.Random(seed)
    return [rng.choice(pool) for _ in range(batch_size)] if pool else []


async def quarantined(farm: Farm) -> set[tuple[str, int | None]]:
    """The farm's tasks out of rotation; none when it cannot say (an older farm)."""
    try:
        return {(q.env, q.task_idx) for q in await farm.quarantined()}
    except EnvfarmError:
        return set()


def grpo_config(config: TrainConfig) -> GRPOConfig:
    """The update's settings of a training run."""
    return GRPOConfig(clip_low=config.clip_low, clip_high=config.clip_high,
                      kl_coef=config.kl_coef, micro_batch=config.micro_batch,
                      max_grad_norm=config.max_grad_norm, mini_batches=config.mini_batches,
                      ppo_epochs=config.ppo_epochs, logit_chunk=config.logit_chunk,
                      autocast=config.autocast, seed=config.seed,
                      importance=config.importance,
                      temperature=config.temperature if config.temperature > 0 else 1.0)


def rollout_samples(groups: list[list[EpisodeResult]], tokenizer: Any
                    ) -> tuple[list[Sample], int]:
    """One sample per assistant turn of every episode with an advantage, each carrying its
    turn's credit (``trainer.grpo.step_advantages``); and how many groups had signal."""
    out: list[Sample] = []
    used = 0
    for group in groups:
        advs = group_advantages([e.reward if e.valid else None for e in group])
        if any(a is not None for a in advs):
            used += 1
        for episode, adv in zip(group, advs):
            if adv is None:
                continue
            violated = episode.outcome == Outcome.format_error.value
            credit = step_advantages(adv, len(episode.turns), violated)
            out += [turn_sample(tokenizer, rec, a) for rec, a in zip(episode.turns, credit)]
    return out, used


def turn_sample(tokenizer: Any, rec: TurnRecord, advantage: float) -> Sample:
    gen = rec.generation
    if gen.completion_ids is not None and gen.prompt_ids is not None:
        return Sample(gen.prompt_ids, gen.completion_ids, advantage, gen.logprobs,
                      gen.temperature or None)  # greedy (0): the config's, as before
    # text from another policy (a guide): tokenized the way the model would have seen it
    return Sample(encode_prompt(tokenizer, rec.prompt),
                  encode_completion(tokenizer, gen.text, gen.finish_reason == FINISH_STOP),
                  advantage)


def _tiny() -> Path:
    from trainer.tiny_model import tiny_model_path

    return tiny_model_path()


async def train(config: TrainConfig, farm_url: str, log: Any = print) -> list[dict[str, Any]]:
    """Run steps until ``config.steps`` are done (resuming where a checkpoint says)."""
    trainer = Trainer(config, farm_url)
    records = []
    try:
        while not trainer.done:
            record = await trainer.train_step()
            records.append(record)
            log(json.dumps(headline(record)))
    finally:
        if trainer.judge is not None:
            await trainer.judge.aclose()
    return records


def headline(record: dict[str, Any]) -> dict[str, Any]:
    keys = ("step", "model_episodes", "model_reward_mean", "model_success_rate",
            "model_format_error_rate", "guided_episodes", "guided_success_rate", "reward_mean",
            "invalid_rate", "update_samples", "update_clip_frac", "rollout_s", "update_s")
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()
            if k in keys}
