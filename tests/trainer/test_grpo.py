"""GRPO with the tiny model: the update goes the way the advantages say; the drop rules."""

from __future__ import annotations

import copy

import pytest
import torch

from judge import Message
from trainer.format import call_tool_text, final_text, system_prompt, tool_call_text
from trainer.grpo import GRPOConfig, Sample, completion_logprob, grpo_step, group_advantages
from trainer.hf import encode_completion, encode_prompt, load_model


def test_invalid_rewards_are_dropped_not_zeroed():
    adv = group_advantages([1.0, None, 0.0, None])
    assert adv[1] is None and adv[3] is None
    assert adv[0] == pytest.approx(1.0, abs=1e-4) and adv[2] == pytest.approx(-1.0, abs=1e-4)
    # counted as 0 instead, the group would be [1, 0, 0, 0]: a different advantage for reward 1
    assert adv[0] != pytest.approx(group_advantages([1.0, 0.0, 0.0, 0.0])[0], abs=1e-3)


@pytest.mark.parametrize("rewards", [[1.0, None, None], [None, None], [0.5, 0.5, None, 0.5],
                                     [-1.0, -1.0, -1.0, -1.0]])
def test_groups_without_signal_contribute_nothing(rewards):
    assert group_advantages(rewards) == [None] * len(rewards)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    torch.manual_seed(0)
    return load_model(tiny_model)


def _group(tokenizer) -> list[Sample]:
    prompt = encode_prompt(tokenizer, [Message(role="system", content=system_prompt()),
                                       Message(role="user", content="Book a room in Lisbon.")])
    texts = [tool_call_text("list_tools", {}, "List the tools first."),
             call_tool_text("search_hotels", {"city": "Lisbon"}, "Search."),
             final_text("I booked it.", "Done."),
             "no reasoning, no call"]
    advs = group_advantages([1.0, 0.1, 0.0, -1.0])
    return [Sample(prompt, encode_completion(tokenizer, t), a) for t, a in zip(texts, advs)]


def _step(model, tokenizer, samples, sign=1.0):
    model = copy.deepcopy(model)
    ref = copy.deepcopy(model).eval()
    flipped = [Sample(s.prompt_ids, s.completion_ids, sign * s.advantage) for s in samples]
    before = [completion_logprob(model, s, tokenizer.pad_token_id) for s in samples]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    stats = grpo_step(model, ref, opt, flipped, tokenizer.pad_token_id,
                      GRPOConfig(max_grad_norm=1e9))
    after = [completion_logprob(model, s, tokenizer.pad_token_id) for s in samples]
    return [a - b for a, b in zip(after, before)], stats


def test_one_step_raises_best_and_lowers_worst(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    samples = _group(tokenizer)
    change, stats = _step(model, tokenizer, samples)
    assert change[0] > 0, change   # reward 1.0
    assert change[-1] < 0, change  # reward -1.0
    assert stats["samples"] == 4 and stats["tokens"] == sum(len(s.completion_ids) for s in samples)
    # the same step with the advantages' sign flipped moves both the other way
    flipped, _ = _step(model, tokenizer, samples, sign=-1.0)
    assert flipped[0] < 0 and flipped[-1] > 0


def test_loss_sees_only_completion_tokens(model_and_tokenizer):
    """Changing the prompt's tokens changes nothing the loss is taken over but the condition;
    a sample whose completion is empty contributes no tokens and no step."""
    model, tokenizer = model_and_tokenizer
    s = _group(tokenizer)[0]
    from trainer.grpo import _batch

    ids, attn, targets, mask = _batch([s], tokenizer.pad_token_id, "cpu")
    assert int(mask.sum()) == len(s.completion_ids)
    picked = targets[0][mask[0].bool()].tolist()
    assert picked == s.completion_ids
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert grpo_step(model, None, opt, [Sample(s.prompt_ids, [], 1.0)], 0)["samples"] == 0
