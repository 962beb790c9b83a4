"""Batched generation (trainer.batched): the same tokens and log-probs as one prompt at a time,
each row's sampling independent of its batch, and lockstep episodes deterministic under a seed."""

from __future__ import annotations

import pytest
import torch

from trainer.batched import BatchedPolicy, generate_batch, row_seed, run_lockstep
from trainer.episode import EpisodeConfig
from trainer.grpo import Sample, completion_logprobs
from trainer.hf import end_token_id, load_model


@pytest.fixture(scope="module")
def tiny(tiny_model):
    model, tokenizer = load_model(tiny_model)
    return model.eval(), tokenizer


def _prompts(tokenizer) -> list[list[int]]:
    return [tokenizer("Transfer money: amount " + "12 " * k).input_ids for k in (1, 7, 20)]


def test_a_left_padded_batch_generates_what_each_prompt_does_alone(tiny) -> None:
    model, tok = tiny
    eos, pad = end_token_id(tok), tok.pad_token_id
    prompts = _prompts(tok)
    batch = generate_batch(model, prompts, max_new_tokens=12, temperature=0.0, eos=eos, pad=pad)
    hf = model.generate(torch.tensor([prompts[1]]), do_sample=False, max_new_tokens=12, eos_token_id=eos,
                        pad_token_id=pad)
    assert batch[1][0] == hf[0, len(prompts[1]):].tolist()[:len(batch[1][0])]
    for prompt, (ids, logps) in zip(prompts, batch, strict=True):
        alone = generate_batch(model, [prompt], max_new_tokens=12, temperature=0.0, eos=eos, pad=pad)[0]
        assert ids == alone[0] and len(ids) == len(logps) == 12
        # the log-probs are the model's on the whole sequence (what GRPO's ratio starts from)
        scored = completion_logprobs(model, [Sample(prompt, ids, 0.0)], pad).detach()
        assert torch.allclose(scored, torch.tensor(logps), atol=1e-4)


def test_sampled_at_a_temperature_the_logprobs_are_the_sampling_policys(tiny) -> None:
    """What the sampler records is what GRPO's update scores at the same temperature (its
    ratio starts at 1), not the raw logits' log-probs."""
    model, tok = tiny
    eos, pad = end_token_id(tok), tok.pad_token_id
    gens = [torch.Generator().manual_seed(k) for k in range(3)]
    batch = generate_batch(model, _prompts(tok), max_new_tokens=10, temperature=0.6, eos=eos,
                           pad=pad, generators=gens)
    for prompt, (ids, logps) in zip(_prompts(tok), batch, strict=True):
        sample = Sample(prompt, ids, 0.0)
        at_t = completion_logprobs(model, [sample], pad, temperature=0.6).detach()
        raw = completion_logprobs(model, [sample], pad).detach()
        assert torch.allclose(at_t, torch.tensor(logps), atol=1e-4)
        assert not torch.allclose(raw, torch.tensor(logps), atol=1e-3)


def test_a_rows_sample_does_not_depend_on_its_batch(tiny) -> None:
    model, tok = tiny
    eos, pad = end_token_id(tok), tok.pad_token_id
    prompts = _prompts(tok)

    def sample(rows: list[int], keys: list[str]) -> list[list[int]]:
        gens = [torch.Generator().manual_seed(row_seed(7, (k,))) for k in keys]
        out = generate_batch(model, [prompts[r] for r in rows], max_new_tokens=10, temperature=1.0,
                             eos=eos, pad=pad, generators=gens)
        return [ids for ids, _ in out]

    alone = sample([2], ["c"])[0]
    assert sample([0, 1, 2], ["a", "b", "c"])[2] == alone
    assert sample([2], ["d"])[0] != alone  # another key, another draw (10 tokens from ~2k each)


def test_rows_at_their_own_temperatures_sample_what_each_does_alone(tiny) -> None:
    """Per-row temperatures (a GRPO group mixing them): each row's tokens and log-probs are
    what it gives alone at its temperature, greedy (0) included."""
    model, tok = tiny
    eos, pad = end_token_id(tok), tok.pad_token_id
    prompts, temps = _prompts(tok), [0.6, 0.0, 1.3]

    def gens(rows):
        return [torch.Generator().manual_seed(row_seed(5, (r,))) for r in rows]

    mixed = generate_batch(model, prompts, max_new_tokens=10, temperature=temps, eos=eos, pad=pad,
                           generators=gens(range(3)))
    for r, (prompt, t) in enumerate(zip(prompts, temps, strict=True)):
        ids, logps = generate_batch(model, [prompt], max_new_tokens=10, temperature=t, eos=eos,
                                    pad=pad, generators=gens([r]))[0]
        assert mixed[r][0] == ids
        assert mixed[r][1] == pytest.approx(logps, abs=1e-4)
    with pytest.raises(ValueError, match="2 temperatures for 3 prompts"):
        generate_batch(model, prompts, max_new_tokens=2, temperature=[1.0, 1.0], eos=eos, pad=pad)


async def test_lockstep_episodes_are_deterministic_under_a_seed(tiny, farm, bundled_catalog) -> None:
    model, tok = tiny
    jobs = [("personal_banking_1", 0), ("hotel_booking_1", 1), ("personal_banking_1", 2)] * 2
    config = EpisodeConfig(max_turns=3, tool_listing="names", max_tool_chars=200)

    async def tokens(seed: int) -> list[list[int]]:
        policy = BatchedPolicy(model, tok, max_new_tokens=8, temperature=1.0, seed=seed, max_batch=4)
        results = await run_lockstep(farm, policy, jobs, config=config, tag="t")
        assert all(t.generation.policy == "hf-batched" for r in results for t in r.turns)
        return [t.generation.completion_ids for r in results for t in r.turns]

    first = await tokens(1)
    assert first == await tokens(1)
    assert first != await tokens(2)
