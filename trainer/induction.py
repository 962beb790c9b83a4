"""Copy warm-up: teach a random-init model to copy before it sees a single task.

Following a request means copying it: the ids, names and amounts a call needs are written in the
request, and no model can memorise values it has never seen (the held-out tasks' are new). A
small transformer copies through an *induction head* (attend to the token after the last time
the current token appeared), and one forms abruptly after ~1,000-1,500 steps of data that
rewards copying; the task suite alone is too small and too repetitive for that. So before SFT
the model trains on pure copy rows: random token spans, drawn from the tokens of the train
texts, written twice with random filler between, loss on the second copy only. Measured: a
2-layer, 128-wide Qwen3 at lr 1e-3 (200-step warm-up, AdamW, no weight decay) stays near chance
(ln V) until step ~1,100, then falls to ~0.15 nats by step 1,500 (benchmarks/passes/
2026-11-27-learning.md).

    curve = copy_warmup(model, pool, CopyWarmup(steps=1500), seed=0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CopyWarmup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=0, ge=0, description="optimizer steps (0: no warm-up)")
    lr: float = Field(default=1e-3, gt=0)
    batch: int = Field(default=32, ge=1)
    length: int = Field(default=128, ge=32, description="tokens per row")
    span: tuple[int, int] = Field(default=(6, 24), description="copied span length, min and max")

    @model_validator(mode="after")
    def _fits(self) -> CopyWarmup:
        lo, hi = self.span
        if not 2 <= lo <= hi:
            raise ValueError(f"span {self.span}: need 2 <= min <= max (the first token is not scored)")
        if 2 * hi > self.length:
            raise ValueError(f"a row of {self.length} tokens cannot hold a span of {hi} twice")
        return self


def token_pool(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Ids of the ordinary tokens the texts are made of (special tokens excluded)."""
    special = set(tokenizer.all_special_ids)
    seen: set[int] = set()
    for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        seen.update(ids)
    return sorted(seen - special)


def copy_rows(pool: Sequence[int], cfg: CopyWarmup, gen: Any) -> tuple[Any, Any]:
    """One batch: (ids [batch, length], loss mask) of filler, span, filler, span again."""
    import torch

    lo, hi = cfg.span
    table = torch.tensor(pool)
    ids = table[torch.randint(len(pool), (cfg.batch, cfg.length), generator=gen)]
    mask = torch.zeros((cfg.batch, cfg.length), dtype=torch.bool)
    for row in range(cfg.batch):
        n = int(torch.randint(lo, hi + 1, (), generator=gen))
        first = int(torch.randint(0, cfg.length - 2 * n + 1, (), generator=gen))
        second = int(torch.randint(first + n, cfg.length - n + 1, (), generator=gen))
        ids[row, second:second + n] = ids[row, first:first + n]
        mask[row, second + 1:second + n] = True  # the span's first token is unpredictable
    return ids, mask


def copy_warmup(model: Any, pool: Sequence[int], cfg: CopyWarmup, seed: int) -> list[float]:
    """Train ``model`` on copy rows for ``cfg.steps`` steps; the mean loss of every 100 steps
    (nats per copied token; chance is ln(len(pool)))."""
    import torch

    if cfg.steps == 0:
        return []
    if len(pool) < 2:
        raise ValueError(f"copy warm-up needs a pool of at least 2 tokens, got {len(pool)}")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)
    ramp = max(1, min(200, cfg.steps // 5))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / ramp))
    model.train()
    curve, window = [], []
    for _ in range(cfg.steps):
        ids, mask = copy_rows(pool, cfg, gen)
        # logits at the copied positions only: the unembedding is most of a small model's cost
        hidden = getattr(model, model.base_model_prefix)(input_ids=ids).last_hidden_state
        rows, cols = mask[:, 1:].nonzero(as_tuple=True)
        logits = model.get_output_embeddings()(hidden[rows, cols]).float()
        loss = torch.nn.functional.cross_entropy(logits, ids[rows, cols + 1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        window.append(float(loss.detach()))
        if len(window) == 100:
            curve.append(sum(window) / 100)
            window = []
    if window:
        curve.append(sum(window) / len(window))
    model.eval()
    return curve


def chance(pool: Sequence[int]) -> float:
    """The copy loss of a model that has not learned to copy: uniform over the pool."""
    return math.log(len(pool))
