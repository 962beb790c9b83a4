"""GRPO with the tiny model: the update goes the way the advantages say, the loss by hand (each
term pinned so a swapped clip bound, a flipped sign or KL direction, ignored rollout log-probs or
a shifted loss mask fails), mini-batches that make the clip bind, and the drop rules."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from judge import Message
from trainer.format import call_tool_text, final_text, system_prompt, tool_call_text
from trainer.grpo import (
    GRPOConfig,
    Sample,
    completion_logprob,
    completion_logprobs,
    group_advantages,
    grpo_step,
    policy_loss,
    step_advantages,
)
from trainer.config import TrainConfig
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


def test_step_credit_is_the_papers():
    """Normal end: the outcome's advantage on every turn. Format violation: on the violating
    (last) turn only; the turns before it get 0."""
    assert step_advantages(0.7, 3, violated=False) == [0.7, 0.7, 0.7]
    assert step_advantages(-1.2, 3, violated=True) == [0.0, 0.0, -1.2]
    assert step_advantages(-1.2, 1, violated=True) == [-1.2]
    assert step_advantages(0.5, 0, violated=True) == []


# -- the loss by hand ----------------------------------------------------------------------------
CFG = GRPOConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.001)


def _loss(ratio: float, adv: float, ref_minus_logp: float | None = None):
    logp = torch.tensor([-1.0])
    old = logp - math.log(ratio)
    ref = None if ref_minus_logp is None else logp + ref_minus_logp
    return policy_loss(logp, old, ref, torch.tensor([adv]), CFG)


CLIP_CASES = [
    (1.25, 1.0, -1.25, False),   # inside (0.8, 1.28): a swapped bound (high 0.2) clips to 1.2
    (1.5, 1.0, -1.28, True),     # above the high bound, positive advantage: clipped
    (1.5, -1.0, 1.5, False),     # negative advantage: the unclipped, larger loss is taken
    (0.75, -1.0, 0.8, True),     # below the low bound 0.8 (swapped: 0.72 would not clip)
    (0.75, 1.0, -0.75, False),   # positive advantage, ratio low: the unclipped term is taken
    (1.5, 0.0, 0.0, False),      # no advantage: nothing to cut
]


@pytest.mark.parametrize("ratio, adv, pg, clipped", CLIP_CASES)
def test_clipped_policy_gradient_by_hand(ratio, adv, pg, clipped):
    per_token, pg_term, kl, was_clipped = _loss(ratio, adv)
    assert float(pg_term) == pytest.approx(pg, rel=1e-5)
    assert float(per_token) == pytest.approx(pg, rel=1e-5) and kl is None
    assert bool(was_clipped) is clipped


def test_clip_frac_counts_exactly_the_tokens_whose_gradient_the_clip_cut():
    """verl's count: a token is clipped where the clipped term is the one taken and its
    gradient is zero; a ratio outside the bounds whose unclipped term is taken still trains."""
    ratios = torch.tensor([r for r, *_ in CLIP_CASES])
    adv = torch.tensor([a for _, a, *_ in CLIP_CASES])
    logp = torch.full_like(ratios, -1.0, requires_grad=True)
    _, pg, _, was_clipped = policy_loss(logp, logp.detach() - ratios.log(), None, adv, CFG)
    pg.sum().backward()
    no_gradient = (logp.grad == 0) & (adv != 0)
    assert was_clipped.tolist() == no_gradient.tolist() == [c for *_, c in CLIP_CASES]
    # the unclipped tokens' gradient is -adv x ratio (d ratio / d log pi = ratio)
    trained = ~was_clipped
    assert logp.grad[trained].tolist() == pytest.approx((-adv * ratios)[trained].tolist())


# -- sequence-level importance sampling by hand ----------------------------------------------------
SEQ = GRPOConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0, importance="sequence")


def test_sequence_level_ratio_and_its_gradient_by_hand():
    """Three samples of 2, 3 and 1 tokens. A: log-ratios 0.5 and -0.4, geometric mean
    e^0.05 = 1.0513 inside the bounds: both tokens train with gradient -A x 1.0513 (token-level,
    token 0's ratio 1.6487 would be clipped). B: e^((0.5 + 0.4 + 0.2) / 3) = 1.4429 above 1.28
    with A > 0: all three cut (token-level, 1.2214 would not be). C: ratio 0.7408 < 0.8 with
    A < 0: cut."""
    logp = torch.tensor([-1.0, -2.0, -0.5, -0.5, -0.5, -1.0], requires_grad=True)
    old = torch.tensor([-1.5, -1.6, -1.0, -0.9, -0.7, -0.7])
    adv = torch.tensor([1.0, 1.0, 0.5, 0.5, 0.5, -1.0])
    per_token, pg, kl, clipped = policy_loss(logp, old, None, adv, SEQ, [2, 3, 1])
    s_a, s_b, s_c = math.exp(0.05), math.exp(1.1 / 3), math.exp(-0.3)
    assert (s_a, s_b, s_c) == pytest.approx((1.05127, 1.44292, 0.74082), abs=1e-5)
    assert pg.tolist() == pytest.approx([-s_a, -s_a, -0.64, -0.64, -0.64, 0.8], abs=1e-5)
    assert clipped.tolist() == [False, False, True, True, True, True] and kl is None
    per_token.sum().backward()
    # d/d logp_t of sum_t' -A s(theta): -A x s x (1/|y|) per token of the sample, |y| times
    assert logp.grad.tolist() == pytest.approx([-s_a, -s_a, 0, 0, 0, 0], abs=1e-5)
    # the same tokens at token level: A's first token clipped, B's last not
    logp.grad = None
    _, _, _, token_clipped = policy_loss(logp, old, None, adv, GRPOConfig(kl_coef=0.0))
    assert token_clipped.tolist() == [True, False, True, True, False, True]


def test_sequence_level_gradient_of_an_unclipped_sample_is_the_mean_token_gradient():
    """GSPO: grad s = s x mean_t grad log pi_t; with token-mean aggregation each of the |y|
    tokens carries s: the sample's loss gradient is -A x s x sum_t grad log pi_t. Checked
    with log pi = w x c_t for a scalar w."""
    w = torch.tensor(1.0, requires_grad=True)
    c = torch.tensor([-0.2, -0.5, -0.3, -0.4])
    old = torch.tensor([-0.25, -0.45, -0.3, -0.5])
    per_token, *_ = policy_loss(w * c, old, None, torch.full((4,), 2.0), SEQ, [4])
    per_token.sum().backward()
    s = math.exp(float((c - old).mean()))
    assert float(w.grad) == pytest.approx(-2.0 * s * float(c.sum()), rel=1e-5)


def test_sequence_level_needs_the_samples_lengths():
    with pytest.raises(ValueError, match="token count"):
        policy_loss(torch.zeros(3), torch.zeros(3), None, torch.ones(3), SEQ, [2])
    with pytest.raises(ValueError, match="importance"):
        GRPOConfig(importance="tokens")


def test_kl_is_k3_of_pi_against_the_reference():
    """k3 with delta = log ref - log pi: exp(delta) - delta - 1 (the reversed direction gives
    exp(-delta) + delta - 1 = 0.1065 here, not 0.1487)."""
    per_token, _, kl, _ = _loss(1.0, 1.0, ref_minus_logp=0.5)
    assert float(kl) == pytest.approx(math.exp(0.5) - 0.5 - 1, rel=1e-5)
    assert float(per_token) == pytest.approx(-1.0 + 0.001 * (math.exp(0.5) - 1.5), rel=1e-5)
    # the KL pulls pi towards the reference: its gradient raises log pi when ref is above
    logp = torch.tensor([-1.0], requires_grad=True)
    policy_loss(logp, logp.detach(), logp.detach() + 0.5, torch.tensor([0.0]), CFG)[0].backward()
    assert float(logp.grad) < 0


# -- with the tiny model -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    torch.manual_seed(0)
    return load_model(tiny_model, dtype="float32")


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


def _reference_logprobs(model, sample: Sample) -> list[float]:
    """Independently: the full forward's logits, position t predicting token t + 1."""
    seq = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=seq).logits[0].float(), dim=-1)
    start = len(sample.prompt_ids)
    return [float(logp[start + k - 1, tok]) for k, tok in enumerate(sample.completion_ids)]


def test_logprobs_are_taken_at_the_completions_positions(model_and_tokenizer):
    """Chunked, completion-only log-probs equal the full forward's at the right positions, for
    samples of different lengths padded together, whatever the chunk size."""
    model, tokenizer = model_and_tokenizer
    samples = _group(tokenizer)
    expected = [lp for s in samples for lp in _reference_logprobs(model, s)]
    for chunk in (1, 7, 4096):
        with torch.no_grad():
            got = completion_logprobs(model, samples, tokenizer.pad_token_id, chunk=chunk)
        assert got.tolist() == pytest.approx(expected, abs=1e-4)


def test_at_a_temperature_the_logprobs_are_the_sampling_policys(model_and_tokenizer):
    """Rollouts sampled at T are scored under softmax(logits / T), verl's rule: by hand from
    the full forward's logits; at T = 1 the raw logits' log-probs. A trainer that scored them
    at T = 1 (the earlier rule) would start every update from ratios away from 1."""
    model, tokenizer = model_and_tokenizer
    samples = _group(tokenizer)
    for temperature in (0.5, 1.0, 1.7):
        expected = []
        for s in samples:
            seq = torch.tensor([s.prompt_ids + s.completion_ids])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=seq).logits[0].float() / temperature,
                                         dim=-1)
            start = len(s.prompt_ids)
            expected += [float(logp[start + k - 1, t]) for k, t in enumerate(s.completion_ids)]
        with torch.no_grad():
            got = completion_logprobs(model, samples, tokenizer.pad_token_id, chunk=3,
                                      temperature=temperature)
        assert got.tolist() == pytest.approx(expected, abs=1e-4)
    with pytest.raises(ValueError, match="temperature"):
        GRPOConfig(temperature=0.0)


def test_the_loss_is_taken_against_the_rollouts_logprobs_at_the_right_tokens(
        model_and_tokenizer):
    """Rollout log-probs 1.1x below the model's, token by token: the ratio is 1.1 at every
    completion token (pg_loss = -1.1 x advantage), none clipped. Ignoring the rollout's
    log-probs (ratio 1) or a loss mask shifted onto other positions gives another loss."""
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    samples = [Sample(s.prompt_ids, s.completion_ids, 1.0,
                      [lp - math.log(1.1) for lp in _reference_logprobs(model, s)])
               for s in _group(tokenizer)[:3]]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = grpo_step(model, None, opt, samples, tokenizer.pad_token_id, GRPOConfig())
    assert stats["pg_loss"] == pytest.approx(-1.1, rel=1e-4)
    assert stats["clip_frac"] == 0.0
    # rollout log-probs 2x below: every token's ratio is 2, clipped at 1.28
    far = [Sample(s.prompt_ids, s.completion_ids, 1.0,
                  [lp - math.log(2.0) for lp in _reference_logprobs(model, s)]) for s in samples]
    stats = grpo_step(model, None, opt, far, tokenizer.pad_token_id, GRPOConfig())
    assert stats["clip_frac"] == 1.0 and stats["pg_loss"] == pytest.approx(-1.28, rel=1e-4)


def _at(model, sample: Sample, temperature: float) -> list[float]:
    """Independently: a sample's log-probs under softmax(logits / T) of the full forward."""
    seq = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=seq).logits[0].float() / temperature, dim=-1)
    start = len(sample.prompt_ids)
    return [float(logp[start + k - 1, t]) for k, t in enumerate(sample.completion_ids)]


def test_a_batch_mixing_temperatures_scores_each_sample_under_its_own(model_and_tokenizer):
    """One temperature per sample (a group rolled out at 0.7 and 1.0): the log-probs are each
    sample's own softmax(logits / T), whatever the chunking; the update's ratio starts at 1 for
    every sample (pg_loss is exactly -mean advantage per token, nothing clipped), where scoring
    them all at the config's temperature would not."""
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    temps = [0.7, 1.0, 0.7, 1.6]
    samples = [Sample(s.prompt_ids, s.completion_ids, adv, None, t)
               for s, adv, t in zip(_group(tokenizer), (1.0, -1.0, 0.5, -0.25), temps)]
    expected = [lp for s in samples for lp in _at(model, s, s.temperature)]
    for chunk in (1, 5, 4096):
        with torch.no_grad():
            got = completion_logprobs(model, samples, tokenizer.pad_token_id, chunk=chunk,
                                      temperature=temps)
        assert got.tolist() == pytest.approx(expected, abs=1e-4)
    rolled = [Sample(s.prompt_ids, s.completion_ids, s.advantage, _at(model, s, s.temperature),
                     s.temperature) for s in samples]
    tokens = sum(len(s.completion_ids) for s in samples)
    mean_adv = sum(s.advantage * len(s.completion_ids) for s in samples) / tokens
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = grpo_step(model, None, opt, rolled, tokenizer.pad_token_id,
                      GRPOConfig(temperature=0.7, micro_batch=3))
    assert stats["pg_loss"] == pytest.approx(-mean_adv, abs=1e-5)
    assert stats["clip_frac"] == 0.0
    one_t = [Sample(s.prompt_ids, s.completion_ids, s.advantage, s.old_logprobs) for s in rolled]
    stats = grpo_step(model, None, opt, one_t, tokenizer.pad_token_id, GRPOConfig(temperature=0.7))
    assert stats["clip_frac"] > 0.0  # scored at 0.7, the 1.0 and 1.6 samples start off 1
    greedy = [Sample(s.prompt_ids, s.completion_ids, 1.0, None, 0.0) for s in samples[:1]]
    with pytest.raises(ValueError, match="temperature > 0"):
        grpo_step(model, None, opt, greedy, tokenizer.pad_token_id, GRPOConfig())


def test_group_temperatures_cycle_over_a_groups_members_and_need_the_batched_policy():
    cfg = TrainConfig(group_temperatures=[0.7, 1.0], batched=True, temperature=0.5)
    assert [cfg.temperature_of(m) for m in range(5)] == [0.7, 1.0, 0.7, 1.0, 0.7]
    assert TrainConfig(temperature=0.5).temperature_of(3) == 0.5
    with pytest.raises(ValueError, match="batched"):
        TrainConfig(group_temperatures=[0.7, 1.0])
    with pytest.raises(ValueError, match="> 0"):
        TrainConfig(group_temperatures=[0.0, 1.0], batched=True)
    with pytest.raises(ValueError, match="branch"):
        TrainConfig(group_temperatures=[1.0], batched=True, branch_at=1)


def _alternating_old(model, sample: Sample, spread: float) -> list[float]:
    """Rollout log-probs whose token ratios are 1.1 x e^(+-spread), alternating, with a last
    odd token at 1.1: every sample's geometric-mean ratio is exactly 1.1."""
    lps = _reference_logprobs(model, sample)
    paired = len(lps) - len(lps) % 2
    return [lp - math.log(1.1) - (spread if k % 2 == 0 else -spread) * (k < paired)
            for k, lp in enumerate(lps)]


def test_sequence_level_importance_in_the_update(model_and_tokenizer):
    """Token ratios 2.0 and 0.60 alternating, geometric mean 1.1: at token level every other
    token is clipped (the ratio-2 ones, advantage > 0); at sequence level none is, and the
    policy-gradient loss is -1.1 x advantage."""
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    samples = [Sample(s.prompt_ids, s.completion_ids, 1.0,
                      _alternating_old(model, s, math.log(2.0 / 1.1)))
               for s in _group(tokenizer)]  # 32, 44, 14 and 9 tokens
    tokens = sum(len(s.completion_ids) for s in samples)
    high = sum(len(s.completion_ids) // 2 for s in samples)  # ratio 2: the even positions
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seq = grpo_step(model, None, opt, samples, tokenizer.pad_token_id,
                    GRPOConfig(importance="sequence"))
    assert seq["clip_frac"] == 0.0 and seq["pg_loss"] == pytest.approx(-1.1, rel=1e-4)
    tok = grpo_step(model, None, opt, samples, tokenizer.pad_token_id, GRPOConfig())
    assert tok["clip_frac"] == pytest.approx(high / tokens, abs=1e-6)
    assert tok["pg_loss"] != pytest.approx(-1.1, rel=1e-2)


def test_sequence_importance_is_a_training_option():
    from trainer.config import TrainConfig
    from trainer.train import grpo_config

    assert grpo_config(TrainConfig(importance="sequence")).importance == "sequence"
    assert grpo_config(TrainConfig()).importance == "token"
    with pytest.raises(ValueError, match="importance"):
        TrainConfig(importance="geometric")


# -- the loss that is back-propagated ------------------------------------------------------------
def _gradients_per_optimizer_step(model, samples, pad_id, cfg: GRPOConfig):
    """Run ``grpo_step`` with lr 0 and record, at every optimizer step, the gradient the
    optimizer was given (flat)."""
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.0)
    seen: list[torch.Tensor] = []
    opt.register_step_pre_hook(lambda *_: seen.append(torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten().clone()
        for p in params])))
    grpo_step(model, None, opt, samples, pad_id, cfg)
    return seen


def _token_mean_gradient(model, samples) -> torch.Tensor:
    """Independently of ``grpo_step``: each sample's own unpadded forward, the clipped loss at
    ratio 1 (its value -A per token, its gradient -A grad log pi), summed over every
    completion token and divided by their number."""
    params = list(model.parameters())
    total = sum(len(s.completion_ids) for s in samples)
    loss = torch.zeros(())
    for s in samples:
        seq = torch.tensor([s.prompt_ids + s.completion_ids])
        logp = torch.log_softmax(model(input_ids=seq).logits[0].float(), dim=-1)
        start = len(s.prompt_ids) - 1
        picked = logp[torch.arange(start, start + len(s.completion_ids)),
                      torch.tensor(s.completion_ids)]
        loss = loss + (-s.advantage * torch.exp(picked - picked.detach())).sum()
    grads = torch.autograd.grad(loss / total, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten()
                      for g, p in zip(grads, params)])


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return float((got - expected).norm() / expected.norm()) < 1e-4


def test_the_backpropagated_loss_is_the_token_mean(model_and_tokenizer):
    """The gradient the optimizer steps on is that of the token-mean over the mini-batch's
    completion tokens (samples of different lengths and advantages, accumulated over micro-
    batches), not of a mean of per-sample means."""
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    samples = _group(tokenizer)
    assert len({len(s.completion_ids) for s in samples}) > 1
    model.train()
    expected = _token_mean_gradient(model, samples)
    (got,) = _gradients_per_optimizer_step(model, samples, tokenizer.pad_token_id,
                                           GRPOConfig(micro_batch=2, max_grad_norm=1e9,
                                                      kl_coef=0.0))
    assert _close(got, expected), float((got - expected).norm() / expected.norm())


def test_each_mini_batch_is_divided_by_its_own_tokens(model_and_tokenizer):
    """Four copies of one sample cut into four mini-batches: each optimizer step's gradient
    is that one sample's token-mean gradient, as with the batch in one piece (divided by the
    whole batch's tokens instead, each would be a quarter of it)."""
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    sample = _group(tokenizer)[0]
    model.train()
    expected = _token_mean_gradient(model, [sample])
    steps = _gradients_per_optimizer_step(model, [sample] * 4, tokenizer.pad_token_id,
                                          GRPOConfig(mini_batches=4, max_grad_norm=1e9))
    assert len(steps) == 4
    assert all(_close(g, expected) for g in steps), [float(g.norm() / expected.norm())
                                                     for g in steps]


def test_mini_batches_and_epochs_move_the_policy_so_the_clip_binds(model_and_tokenizer):
    """One update per batch: the ratio is 1 and nothing is clipped. Four mini-batches over two
    epochs: four x two optimizer steps, and the later ones see a moved policy."""
    model, tokenizer = model_and_tokenizer
    samples = _group(tokenizer) * 2
    still = copy.deepcopy(model)
    one = grpo_step(still, None, torch.optim.SGD(still.parameters(), lr=0.0), samples,
                    tokenizer.pad_token_id, GRPOConfig())
    assert one["clip_frac"] == 0.0 and one["optimizer_steps"] == 1
    moved = copy.deepcopy(model)
    many = grpo_step(moved, None, torch.optim.SGD(moved.parameters(), lr=2.0), samples,
                     tokenizer.pad_token_id,
                     GRPOConfig(mini_batches=4, ppo_epochs=2, micro_batch=1, max_grad_norm=1e9))
    assert many["optimizer_steps"] == 8
    assert many["clip_frac"] > 0.0


def test_loss_sees_only_completion_tokens(model_and_tokenizer):
    """The prompt's tokens only condition: changing the completion-free prompt positions'
    targets changes nothing; an empty completion contributes no tokens and no step."""
    model, tokenizer = model_and_tokenizer
    s = _group(tokenizer)[0]
    from trainer.packing import unpacked

    row = unpacked([s])[0]
    assert [row.ids[t] for t in row.targets] == s.completion_ids
    assert row.targets == list(range(len(s.prompt_ids), len(s.prompt_ids) + len(s.completion_ids)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert grpo_step(model, None, opt, [Sample(s.prompt_ids, [], 1.0)], 0)["samples"] == 0


def test_fp32_master_weights_take_small_steps(tiny_model):
    """At lr 1e-6 a bf16 copy of the weights rounds most updates away; the trainer's fp32
    masters keep them (the trainer loads with param_dtype float32)."""
    model, tokenizer = load_model(tiny_model, dtype="float32")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    samples = _group(tokenizer)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    grpo_step(model, None, opt, samples, tokenizer.pad_token_id, GRPOConfig())
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before))
    total = sum(b.numel() for b in before)
    assert changed / total > 0.5
    bf16 = [b.to(torch.bfloat16) for b in before]
    kept = sum(int((p.detach().to(torch.bfloat16) != b).sum())
               for p, b in zip(model.parameters(), bf16))
    assert kept / total < 0.2  # the same step, stored in bf16, would mostly vanish


def test_the_learning_rate_is_constant_then_falls_linearly_from_lr_decay_from():
    from trainer.config import TrainConfig

    flat = TrainConfig(steps=10, lr=1e-4)
    assert [flat.lr_at(s) for s in (0, 5, 9)] == [1e-4] * 3
    tail = TrainConfig(steps=10, lr=1e-4, lr_decay_from=6)  # 4 decaying steps: 4/4 .. 1/4
    assert [tail.lr_at(s) for s in range(10)] == pytest.approx([1e-4] * 6 + [1e-4, 7.5e-5, 5e-5, 2.5e-5])
    assert TrainConfig(steps=10, lr=1e-4, lr_decay_from=10).lr_at(9) == 1e-4  # never reached


def _episodes(tokenizer) -> list[Sample]:
    """Two episodes' turn samples in rollout order (each turn's prompt: the episode so far),
    the second episode's last turn after its window dropped a turn; each episode at its own
    temperature, each turn its own advantage."""
    out = []
    for e, (temp, city) in enumerate([(0.7, "Lisbon"), (1.0, "Porto and then Faro")]):
        seq = encode_prompt(tokenizer, [Message(role="user", content=f"Book a room in {city}.")])
        head = list(seq)
        for k in range(3):
            turn = encode_completion(tokenizer, call_tool_text("search", {"city": city, "k": k}, "Go."))
            out.append(Sample(list(seq), turn, (k + 1) * (-1) ** e, temperature=temp))
            seq += turn + tokenizer(f" result {k} for {city}").input_ids
        if e:
            out.append(Sample(head + turn, turn, 0.5, temperature=temp))  # window cut turns
    return out


def test_packed_update_is_the_update_of_every_sample_alone(model_and_tokenizer):
    """The update packs an episode's turns into one row and groups rows by length; the step
    it takes is the gradient of the token-mean loss of each sample scored alone (SGD, lr 1:
    the weights move by exactly minus that gradient)."""
    from trainer.packing import pack

    model, tokenizer = model_and_tokenizer
    samples = _episodes(tokenizer)
    assert len(pack(samples)) == 3 < len(samples)  # two episodes' rows, and the cut one
    hand = copy.deepcopy(model)
    tokens = sum(len(s.completion_ids) for s in samples)
    loss = sum(-s.advantage * completion_logprobs(hand, [s], tokenizer.pad_token_id,
                                                  temperature=s.temperature).sum()
               for s in samples) / tokens  # at the sampling policy: every ratio is 1
    loss.backward()
    for packed in (True, False):  # False: one row per sample, the benchmark's baseline
        stepped = copy.deepcopy(model)
        before = {n: p.detach().clone() for n, p in stepped.named_parameters()}
        opt = torch.optim.SGD(stepped.parameters(), lr=1.0)
        grpo_step(stepped, None, opt, samples, tokenizer.pad_token_id,
                  GRPOConfig(kl_coef=0.0, micro_batch=2, max_grad_norm=1e9, pack=packed))
        for name, p in stepped.named_parameters():
            grad = dict(hand.named_parameters())[name].grad
            assert torch.allclose(before[name] - p.detach(), grad, atol=1e-6), (packed, name)
