"""GRPO: group-relative advantages, the paper's per-step credit, and the clipped update.

- Advantages are relative within a group of rollouts of the same task: (R - mean) / std over the
  episodes' rewards. Invalid rewards (``None``: environment, verifier or judge failure) are
  dropped from their group, never counted as 0. A group left with < 2 valid rollouts or zero
  variance contributes nothing.
- Per-step credit (AWM, Sec. 4.1): a rollout that ends normally broadcasts its outcome to every
  step, so each turn's sample carries the episode's advantage; a rollout cut short by a format
  violation puts its -1 on the violating (last) turn only, and its earlier turns get 0
  (``step_advantages``): a correct ``list_tools`` before a bad call is not punished.
- Loss per completion token: PPO's clipped ratio with an asymmetric clip (1 - 0.2, 1 + 0.28)
  against the policy that sampled (the rollout's log-probs when it gave them), plus 0.001 x KL
  to a frozen reference (the k3 estimator, KL(pi || ref)), averaged over the completion tokens of
  a mini-batch (token-mean). Prompt tokens never enter the loss. ``clip_frac`` is the share of
  tokens whose gradient the clip cut (the clipped term selected and different: verl's count).
- ``importance="sequence"`` (GSPO-style; the paper's App. A): every token of a sample takes its
  sequence's ratio, the geometric mean of the token ratios, clipped at sequence level, so one
  far-off token no longer clips alone and a sample is kept or cut whole.
- A batch is cut into ``mini_batches`` optimizer steps and passed over ``ppo_epochs`` times, so
  the policy moves away from the one that sampled and the clip can bind (paper: batch 64,
  mini-batch 16, four updates per batch).
- A sample may carry its own sampling temperature (a group that mixes temperatures): its
  log-probabilities, old, new and reference, are then taken under softmax(logits / its T).
- Scale: an episode's turns share one row (``trainer.packing``: ~2x fewer tokens scored), rows
  of like length share a micro-batch (less padding); log-probabilities are computed only at the
  completion's positions (the hidden states of the prompt never meet the LM head) and the LM
  head runs in chunks of ``logit_chunk`` positions under activation checkpointing, so no
  (batch, length, vocabulary) tensor is ever built.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainer.packing import Packed, by_member, pack, packed_logprobs, unpacked


IMPORTANCE_LEVELS = ("token", "sequence")


@dataclass
class GRPOConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.001
    micro_batch: int = 8
    max_grad_norm: float = 1.0
    mini_batches: int = 1      # optimizer steps per pass over the batch
    ppo_epochs: int = 1        # passes over the batch
    logit_chunk: int = 1024    # completion positions per LM-head chunk
    autocast: str | None = None  # e.g. "bfloat16": compute dtype over fp32 master weights
    seed: int = 0              # mini-batch shuffling
    importance: str = "token"  # "sequence": one ratio per sample (geometric mean, GSPO-style)
    temperature: float = 1.0   # the rollouts': the policy trained is softmax(logits / T) (verl's)
    pack: bool = True          # False: one row per sample, in mini-batch order (the unpacked
                               # update: what the packed one is benchmarked against)

    def __post_init__(self) -> None:
        if self.importance not in IMPORTANCE_LEVELS:
            raise ValueError(f"importance must be one of {IMPORTANCE_LEVELS}, "
                             f"not {self.importance!r}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the sampling policy's), "
                             f"not {self.temperature}")


@dataclass
class Sample:
    """One training sample: its windowed prompt's ids, its turn's ids, its advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    old_logprobs: list[float] | None = None  # None: taken from the model before the update
    temperature: float | None = None  # the policy that sampled it; None: the config's


def group_advantages(rewards: Sequence[float | None], eps: float = 1e-6
                     ) -> list[float | None]:
    """Advantage per rollout of one group; ``None`` where a rollout contributes nothing."""
    valid = [r for r in rewards if r is not None]
    if len(valid) < 2:
        return [None] * len(rewards)
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((r - mean) ** 2 for r in valid) / len(valid))
    if std < eps:
        return [None] * len(rewards)
    return [None if r is None else (r - mean) / (std + eps) for r in rewards]


def step_advantages(advantage: float, turns: int, violated: bool) -> list[float]:
    """Per-turn advantages of one episode: the outcome's advantage on every turn when it ended
    normally; on the violating last turn only (the others 0) when a format rule ended it."""
    if turns <= 0:
        return []
    if not violated:
        return [advantage] * turns
    return [0.0] * (turns - 1) + [advantage]


def policy_loss(logp: torch.Tensor, old: torch.Tensor, ref: torch.Tensor | None,
                adv: torch.Tensor, cfg: GRPOConfig, lengths: Sequence[int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Per-token (loss, policy-gradient term, k3 KL or None, clipped?) over flat completion
    tokens: ``logp`` under the policy being trained, ``old`` under the one that sampled,
    ``ref`` under the reference, ``adv`` each token's advantage; ``lengths``: the samples'
    token counts, in order (needed by ``importance="sequence"``). "clipped" marks the tokens
    whose gradient the clip cut: the clipped term is the larger loss, so it is the one taken."""
    log_ratio = logp - old
    if cfg.importance == "sequence":
        log_ratio = sequence_log_ratio(log_ratio, lengths)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    plain_loss, clipped_loss = -ratio * adv, -clipped * adv
    pg = torch.maximum(plain_loss, clipped_loss)
    was_clipped = clipped_loss > plain_loss
    if ref is None or not cfg.kl_coef:
        return pg, pg, None, was_clipped
    delta = ref - logp
    kl = torch.exp(delta) - delta - 1  # k3 estimate of KL(pi || ref): unbiased, >= 0
    return pg + cfg.kl_coef * kl, pg, kl, was_clipped


def sequence_log_ratio(log_ratio: torch.Tensor, lengths: Sequence[int] | None) -> torch.Tensor:
    """Each token's log-ratio replaced by its sample's mean (the log of the geometric mean of
    the sample's token ratios), with the gradient of that mean."""
    if lengths is None or sum(lengths) != log_ratio.shape[0]:
        raise ValueError("sequence-level importance sampling needs every sample's token count")
    sizes = torch.tensor(list(lengths), device=log_ratio.device)
    owner = torch.repeat_interleave(torch.arange(len(sizes), device=log_ratio.device), sizes)
    sums = torch.zeros(len(sizes), dtype=log_ratio.dtype, device=log_ratio.device)
    means = sums.index_add(0, owner, log_ratio) / sizes.clamp(min=1)
    return means[owner]


def completion_logprobs(model: Any, samples: Sequence[Sample], pad_id: int,
                        chunk: int = 1024, autocast: str | None = None,
                        temperature: float | Sequence[float] = 1.0) -> torch.Tensor:
    """Log-probabilities of every completion token of ``samples``, flat, in sample order, under
    softmax(logits / ``temperature``): the policy that sampled them (one temperature for all,
    or one per sample). Each sample in its own row (``trainer.packing`` says how)."""
    return packed_logprobs(model, unpacked(samples), pad_id, chunk=chunk, autocast=autocast,
                           temperature=temperature)


def completion_logprob(model: Any, sample: Sample, pad_id: int) -> float:
    """Sum of the log-probabilities of a sample's completion tokens (for tests and probes)."""
    with torch.no_grad():
        return float(completion_logprobs(model, [sample], pad_id).sum())


def _chunks(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def _rows(samples: Sequence[Sample], chosen: Sequence[int], cfg: GRPOConfig) -> list[Packed]:
    """The ``chosen`` samples packed (turns of an episode in one row, ``trainer.packing``),
    shortest row first: a micro-batch pads to its longest row, so like lengths go together."""
    if not cfg.pack:
        return unpacked([samples[i] for i in chosen], members=list(chosen))
    order = sorted(chosen)  # rollout order: an episode's turns one after another
    return sorted(pack([samples[i] for i in order], members=order), key=lambda r: len(r.ids))


def _temperatures(samples: Sequence[Sample], cfg: GRPOConfig) -> list[float]:
    """Each sample's sampling temperature (the config's where it names none)."""
    temps = [cfg.temperature if s.temperature is None else s.temperature for s in samples]
    if any(t <= 0 for t in temps):
        raise ValueError("a GRPO sample needs a sampling temperature > 0 (greedy turns have "
                         "no sampling policy to take a ratio against)")
    return temps


def _logprobs(model: Any, rows: Sequence[Packed], temps: Sequence[float], pad_id: int,
              cfg: GRPOConfig) -> dict[int, torch.Tensor]:
    """Each member sample's completion log-probs, by sample index, under its temperature."""
    logp = packed_logprobs(model, rows, pad_id, chunk=cfg.logit_chunk, autocast=cfg.autocast,
                           temperature=temps)
    return by_member(logp, rows)


def grpo_step(model: Any, ref_model: Any | None, optimizer: Any, samples: Sequence[Sample],
              pad_id: int, cfg: GRPOConfig | None = None) -> dict[str, float]:
    """The update for one rollout batch: ``ppo_epochs`` x ``mini_batches`` optimizer steps.
    Returns loss statistics averaged over completion tokens (``clip_frac`` of the last epoch
    shows whether the clip bound). No samples: no step.

    Samples are scored packed (an episode's turns of one mini-batch share a row) and
    ``micro_batch`` rows at a time, rows of like length together: the loss is a sum over
    tokens, so how tokens are grouped into forward passes changes nothing but the time."""
    cfg = cfg or GRPOConfig()
    samples = [s for s in samples if s.completion_ids]
    if not samples:
        return {"loss": 0.0, "samples": 0, "tokens": 0, "optimizer_steps": 0}
    model.train()
    temps = _temperatures(samples, cfg)
    given = {i for i, s in enumerate(samples)
             if s.old_logprobs is not None and len(s.old_logprobs) == len(s.completion_ids)}
    olds = {i: torch.tensor(samples[i].old_logprobs, dtype=torch.float32) for i in given}
    refs: dict[int, torch.Tensor] = {}
    with torch.no_grad():  # fixed for the whole update: the sampling policy and the reference
        for micro in _chunks(_rows(samples, range(len(samples)), cfg), cfg.micro_batch):
            if any(m not in given for r in micro for m in r.members):
                olds.update({i: t.float().cpu() for i, t in
                             _logprobs(model, micro, temps, pad_id, cfg).items() if i not in given})
            if ref_model is not None:
                refs.update({i: t.float().cpu() for i, t in
                             _logprobs(ref_model, micro, temps, pad_id, cfg).items()})
    rng = random.Random(cfg.seed)
    order = list(range(len(samples)))
    n_mini = max(1, min(cfg.mini_batches, len(samples)))
    stats = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
    steps = 0
    for epoch in range(cfg.ppo_epochs):
        if cfg.mini_batches > 1 or epoch:
            rng.shuffle(order)
        last_epoch = epoch == cfg.ppo_epochs - 1
        minis = _chunks(order, math.ceil(len(order) / n_mini))
        for mini in minis:
            tokens = sum(len(samples[i].completion_ids) for i in mini)
            optimizer.zero_grad(set_to_none=True)
            for micro in _chunks(_rows(samples, mini, cfg), cfg.micro_batch):
                members = [m for r in micro for m in r.members]
                got = _logprobs(model, micro, temps, pad_id, cfg)
                logp = torch.cat([got[i] for i in members])
                dev = logp.device
                old = torch.cat([olds[i] for i in members]).to(dev)
                ref = torch.cat([refs[i] for i in members]).to(dev) if refs else None
                adv = torch.tensor([samples[i].advantage for i in members
                                    for _ in samples[i].completion_ids],
                                   dtype=torch.float32, device=dev)
                per_token, pg, kl, clipped = policy_loss(
                    logp.float(), old, ref, adv, cfg, [len(samples[i].completion_ids) for i in members])
                loss = per_token.sum() / tokens  # token-mean over the mini-batch
                loss.backward()
                if last_epoch:
                    share = 1.0 / len(minis)  # each mini-batch's mean weighs the same
                    stats["loss"] += float(loss.detach()) * share
                    stats["pg_loss"] += float(pg.sum().detach()) / tokens * share
                    if kl is not None:
                        stats["kl"] += float(kl.sum().detach()) / tokens * share
                    stats["clip_frac"] += float(clipped.float().sum()) / tokens * share
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            if last_epoch:
                stats["grad_norm"] += float(norm) / len(minis)
            optimizer.step()
            steps += 1
    optimizer.zero_grad(set_to_none=True)
    stats.update(samples=len(samples), tokens=sum(len(s.completion_ids) for s in samples),
                 optimizer_steps=steps)
    return stats
