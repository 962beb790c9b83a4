"""GRPO: group-relative advantages and the clipped policy-gradient update.

- Advantages are relative within a group of rollouts of the same task: (r - mean) / std.
  Invalid rewards (``None``: environment, verifier or judge failure) are dropped from their group,
  never counted as 0. A group left with < 2 valid rollouts or zero variance contributes nothing.
- Every sample of an episode (one per assistant turn, see ``trainer.window``) carries its
  episode's advantage.
- Loss per completion token: PPO's clipped ratio with an asymmetric clip (1 - 0.2, 1 + 0.28),
  plus 0.001 x KL to a frozen reference policy (the k3 estimator), averaged over all completion
  tokens of the batch (token-mean). Prompt tokens never enter the loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class GRPOConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.001
    micro_batch: int = 8
    max_grad_norm: float = 1.0


@dataclass
class Sample:
    """One training sample: its windowed prompt's ids, its turn's ids, its advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    old_logprobs: list[float] | None = None  # None: taken from the model before the update


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


def _batch(samples: Sequence[Sample], pad_id: int, device: Any
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask, and (targets, loss mask) aligned with logits[:, :-1]."""
    width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        seq = s.prompt_ids + s.completion_ids
        ids[i, :len(seq)] = torch.tensor(seq)
        attn[i, :len(seq)] = 1
        # logits at position t predict token t+1: the completion's tokens are predicted from
        # positions len(prompt)-1 ... len(seq)-2
        mask[i, len(s.prompt_ids) - 1:len(seq) - 1] = 1.0
    return ids.to(device), attn.to(device), ids[:, 1:].to(device), mask.to(device)


def token_logprobs(model: Any, samples: Sequence[Sample], pad_id: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position log-probabilities of the next token, and the completion mask."""
    device = next(model.parameters()).device
    ids, attn, targets, mask = _batch(samples, pad_id, device)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(2, targets[..., None])[..., 0]
    return logp, mask


def completion_logprob(model: Any, sample: Sample, pad_id: int) -> float:
    """Sum of the log-probabilities of a sample's completion tokens (for tests and probes)."""
    with torch.no_grad():
        logp, mask = token_logprobs(model, [sample], pad_id)
    return float((logp * mask).sum())


def grpo_step(model: Any, ref_model: Any | None, optimizer: Any, samples: Sequence[Sample],
              pad_id: int, cfg: GRPOConfig | None = None) -> dict[str, float]:
    """One optimizer step over ``samples``; returns loss statistics. No samples: no step."""
    cfg = cfg or GRPOConfig()
    samples = [s for s in samples if s.completion_ids]
    if not samples:
        return {"loss": 0.0, "samples": 0, "tokens": 0}
    chunks = [samples[i:i + cfg.micro_batch] for i in range(0, len(samples), cfg.micro_batch)]
    model.train()
    olds = []
    with torch.no_grad():  # the policy that sampled (one update per rollout batch: = current)
        for chunk in chunks:
            logp, mask = token_logprobs(model, chunk, pad_id)
            old = logp.clone()
            for i, s in enumerate(chunk):
                if s.old_logprobs is not None and len(s.old_logprobs) == len(s.completion_ids):
                    start = len(s.prompt_ids) - 1
                    old[i, start:start + len(s.old_logprobs)] = torch.tensor(s.old_logprobs)
            refs = token_logprobs(ref_model, chunk, pad_id)[0] if ref_model is not None else None
            olds.append((old, refs))
    total_tokens = sum(len(s.completion_ids) for s in samples)
    optimizer.zero_grad(set_to_none=True)
    stats = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0}
    for chunk, (old, refs) in zip(chunks, olds):
        logp, mask = token_logprobs(model, chunk, pad_id)
        adv = torch.tensor([s.advantage for s in chunk], device=logp.device)[:, None]
        ratio = torch.exp(logp - old)
        clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
        pg = -torch.minimum(ratio * adv, clipped * adv)
        per_token = pg
        if refs is not None and cfg.kl_coef:
            delta = refs - logp
            kl = torch.exp(delta) - delta - 1  # k3: unbiased, always >= 0
            per_token = per_token + cfg.kl_coef * kl
            stats["kl"] += float((kl * mask).sum().detach()) / total_tokens
        loss = (per_token * mask).sum() / total_tokens  # token-mean over the whole batch
        loss.backward()
        stats["loss"] += float(loss.detach())
        stats["pg_loss"] += float((pg * mask).sum().detach()) / total_tokens
        stats["clip_frac"] += float((((ratio - clipped).abs() > 0).float() * mask).sum()
                                    .detach()) / total_tokens
    stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                              cfg.max_grad_norm))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    stats.update(samples=len(samples), tokens=total_tokens)
    return stats
