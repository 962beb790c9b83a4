"""The copy warm-up (trainer/induction.py): rows that can only be predicted by copying, a pool
of the texts' own tokens, and a training loop that moves the model on them. Whether a model
learns to copy in N steps is a benchmark (benchmarks/passes/2026-11-27-learning.md)."""

from __future__ import annotations

import pytest
import torch

from trainer.induction import CopyWarmup, chance, copy_rows, copy_warmup, token_pool


def test_rows_repeat_a_span_and_score_only_its_predictable_part() -> None:
    pool = list(range(100, 160))
    cfg = CopyWarmup(batch=64, length=48, span=(5, 9))
    ids, mask = copy_rows(pool, cfg, torch.Generator().manual_seed(3))
    assert ids.shape == mask.shape == (64, 48)
    assert set(ids.flatten().tolist()) <= set(pool)
    for row in range(64):
        scored = mask[row].nonzero().flatten().tolist()
        n = len(scored) + 1  # the span's first token is not scored
        assert 5 <= n <= 9 and scored == list(range(scored[0], scored[0] + n - 1))
        start = scored[0] - 1
        second = ids[row, start:start + n].tolist()
        # the same span appears earlier in the row, wholly before the second copy
        earlier = [i for i in range(0, start - n + 1) if ids[row, i:i + n].tolist() == second]
        assert earlier, f"row {row}: the scored span was never written before"


def test_pool_is_the_texts_ordinary_tokens(tiny_model) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    pool = token_pool(tok, ["list_tools <|im_end|>", "call_tool account_id 42"])
    assert pool and not set(pool) & set(tok.all_special_ids)
    assert set(tok("call_tool account_id 42", add_special_tokens=False).input_ids) <= set(pool)
    assert chance(pool) == pytest.approx(torch.log(torch.tensor(float(len(pool)))).item())


def test_warmup_trains_the_model_on_copy_rows(tiny_model) -> None:
    from trainer.hf import load_model

    model, _ = load_model(tiny_model, dtype="float32")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pool = list(range(20, 60))
    curve = copy_warmup(model, pool, CopyWarmup(steps=250, batch=8, length=32, span=(4, 6)), seed=0)
    assert len(curve) == 3 and all(torch.isfinite(torch.tensor(curve)))
    # from a random init's loss (well above chance) down towards chance: it fits the pool
    assert curve[0] > curve[-1] and curve[-1] < chance(pool) + 0.5
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training
    assert copy_warmup(model, pool, CopyWarmup(steps=0), seed=0) == []
    with pytest.raises(ValueError, match="at least 2 tokens"):
        copy_warmup(model, [7], CopyWarmup(steps=1), seed=0)


def test_settings_that_cannot_make_a_row_are_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="cannot hold a span of 24 twice"):
        CopyWarmup(length=40)
    with pytest.raises(ValidationError, match="min <= max"):
        CopyWarmup(span=(8, 4))
    assert CopyWarmup(length=48).span == (6, 24)
