"""The steps of ``envfarm learn`` (``trainer.learn``): the model, SFT, and evaluation.

- ``new_model``: a tokenizer learned from the catalog's text and the *train* tasks' episodes
  (digits one token each), and a random-init Qwen3 of the config's shape.
- ``reference_samples`` / ``sft``: the train tasks' reference solutions played through the agent
  loop (prompts, windows and tool listings exactly as at rollout), one sample per assistant turn,
  loss on that turn's tokens only; mini-batches of similar lengths, padded.
- ``evaluate``: the model's own episodes on a list of tasks, greedy or sampled, every live
  episode's turn generated in one batch (``trainer.batched``), summed up per split.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainer.batched import BatchedPolicy, run_lockstep
from trainer.episode import EpisodeConfig, EpisodeResult
from trainer.packing import pack, packed_logprobs


def tokenizer_texts(catalog: Any, jobs: Sequence[tuple[str, int]], style: dict[str, bool]) -> list[str]:
    """What the tokenizer learns from: the catalog's own text and the given tasks' requests and
    reference turns (pass the train tasks only: held-out text never shapes the vocabulary).
    ``style``: the reference turns' (``ScriptedPolicy``'s brief, restate, object_arguments)."""
    from trainer.format import BRIEF_SYSTEM
    from trainer.policy import ScriptedPolicy, TurnContext
    from trainer.tiny_model import corpus

    script = ScriptedPolicy.from_catalog(catalog, **style)
    texts = [*corpus(), BRIEF_SYSTEM]
    for env, idx in jobs:
        task = catalog[env].tasks[idx]
        texts.append(task)
        for turn in range(len(catalog[env].solutions[idx]) + 2):
            texts.append(script.turn_text(TurnContext(env=env, task_idx=idx, task=task, turn=turn)))
    return texts


def new_model(out: Path, texts: list[str], spec: Any, seed: int) -> Path:
    """Tokenizer + random-init Qwen3 of the tiny model's shape with ``spec.dims`` over it
    (``spec``: a ``trainer.learn.ModelConfig``), saved in HF format into ``out``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    from trainer.tiny_model import EOS, TINY_CONFIG, train_tokenizer

    hf_logging.disable_progress_bar()

    tokenizer = train_tokenizer(texts, spec.vocab_size, split_digits=spec.split_digits,
                                identifiers=spec.identifiers)
    config = Qwen3Config(vocab_size=len(tokenizer), bos_token_id=None,
                         eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
                         pad_token_id=tokenizer.pad_token_id, **{**TINY_CONFIG, **spec.dims})
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


async def reference_samples(farm_url: str, catalog: Any, jobs: Sequence[tuple[str, int]],
                            episode_cfg: EpisodeConfig, tokenizer: Any, style: dict[str, bool]) -> list[list[Any]]:
    """The tasks' reference solutions through the agent loop (turns written in ``style``: see
    :func:`tokenizer_texts`): per task, one sample per turn."""
    from envfarm.client import Farm
    from trainer.policy import ScriptedPolicy
    from trainer.rollout import run_rollouts
    from trainer.train import turn_sample

    whole = dataclasses.replace(episode_cfg, max_turns=64)  # a reference is never cut short
    async with Farm(farm_url) as farm:
        results = await run_rollouts(farm, ScriptedPolicy.from_catalog(catalog, **style), jobs,
                                     concurrency=32, config=whole)
    failed = [(r.env, r.task_idx, r.reason) for r in results if not r.success]
    if failed:
        raise RuntimeError(f"reference solutions that do not solve their task: {failed[:5]}")
    return [[turn_sample(tokenizer, rec, 1.0) for rec in r.turns] for r in results]


def sft(model: Any, episodes: list[list[Any]], pad_id: int, *, epochs: int, lr: float, batch: int,
        micro_batch: int, seed: int, cosine: bool = False,
        after_epoch: Callable[[int, float], bool] | None = None) -> list[float]:
    """Supervised steps on the turns of ``episodes`` (each a list of turn samples, packed:
    :func:`pack`): token-mean over each batch of ``batch`` sequences, run ``micro_batch`` rows at a
    time, rows of similar length together; the mean loss of each epoch. ``cosine``: the rate
    decays to 0 over ``epochs`` (else constant). ``after_epoch(epoch, loss)`` returning True stops
    early."""
    import math

    import torch

    rows = [p for e in episodes for p in pack(e)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    steps = epochs * math.ceil(len(rows) / batch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, (lambda k: 0.5 * (1 + math.cos(math.pi * k / steps))) if cosine else (lambda k: 1.0))
    rng = random.Random(seed)
    order = list(range(len(rows)))
    losses: list[float] = []
    for epoch in range(epochs):
        model.train()
        rng.shuffle(order)
        total, tokens = 0.0, 0
        for i in range(0, len(order), batch):
            chunk = sorted(order[i:i + batch], key=lambda j: len(rows[j].ids))
            n = sum(len(rows[j].targets) for j in chunk)
            opt.zero_grad(set_to_none=True)
            for k in range(0, len(chunk), micro_batch):
                logp = packed_logprobs(model, [rows[j] for j in chunk[k:k + micro_batch]], pad_id)
                (-logp.sum() / n).backward()
                total += float(-logp.detach().sum())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            tokens += n
        losses.append(total / max(1, tokens))
        if after_epoch is not None and after_epoch(epoch, losses[-1]):
            break
    model.eval()
    return losses


async def evaluate(farm_url: str, model: Any, tokenizer: Any, jobs: Sequence[tuple[str, int]],
                   splits: Sequence[str], episode_cfg: EpisodeConfig, *, temperature: float,
                   max_new_tokens: int, seed: int, tag: str, wave: int = 128, max_batch: int = 64,
                   out: Path | None = None) -> dict[str, Any]:
    """The model's own episodes on ``jobs`` (``wave`` at a time, in lockstep): per split and over
    all, success rate, reward, format-error rate and how episodes ended."""
    from envfarm.client import Farm

    policy = BatchedPolicy(model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature,
                           seed=seed, max_batch=max_batch)
    results: list[EpisodeResult] = []
    async with Farm(farm_url, max_connections=max(64, wave)) as farm:
        for start in range(0, len(jobs), wave):
            results += await run_lockstep(farm, policy, jobs[start:start + wave], config=episode_cfg,
                                          tag=(tag, start))
    if out is not None:
        with out.open("w", encoding="utf-8") as f:
            for r, split in zip(results, splits, strict=True):
                f.write(json.dumps({"env": r.env, "task_idx": r.task_idx, "split": split, "end": r.end.value,
                                    "outcome": r.outcome, "reward": r.reward, "turns": len(r.turns),
                                    "last": r.turns[-1].generation.text[-300:] if r.turns else ""}) + "\n")
    summary = {"all": summarize(results)}
    for split in sorted(set(splits)):
        summary[split] = summarize([r for r, s in zip(results, splits, strict=True) if s == split])
    return summary


def summarize(results: Sequence[EpisodeResult]) -> dict[str, Any]:
    from collections import Counter

    n = len(results)
    valid = [r for r in results if r.valid and r.reward is not None]
    return {"episodes": n, "valid": len(valid), "successes": sum(r.success for r in valid),
            "success_rate": sum(r.success for r in valid) / len(valid) if valid else None,
            "reward_mean": sum(r.reward for r in valid) / len(valid) if valid else None,
            "format_error_rate": sum(r.outcome == "format_error" for r in results) / n if n else None,
            "ends": dict(Counter(r.end.value for r in results))}
