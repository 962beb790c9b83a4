"""From judged episodes to GRPO samples: real episodes against the in-process farm, turned into
samples by the trainer's own ``rollout_samples`` (and the verl plugin's ``turn_outputs``).

A rule-5 episode (``list_tools``, then a final answer with no real call) ends normally, as a
final answer, yet its outcome is a format error: the -1 belongs to the violating last turn, not
to the correct ``list_tools`` turn before it. An invalid episode (the policy's server failed)
is dropped from its group: it neither trains nor moves its siblings' advantages.
"""

from __future__ import annotations

import pytest

from trainer.episode import EndReason, EpisodeResult, run_episode
from trainer.format import final_text, tool_call_text
from trainer.policy import Generation, PolicyError, ScriptedPolicy, TurnContext
from trainer.train import rollout_samples
from trainer.verl_bridge import turn_outputs

ENV = "hotel_booking_1"
LIST = tool_call_text("list_tools", {}, "I list the tools.")


class Turns:
    """Says the given turns in order; ``None`` is the policy's server failing."""

    def __init__(self, *texts: str | None) -> None:
        self.texts = texts

    async def generate(self, messages, ctx: TurnContext) -> Generation:
        text = self.texts[min(ctx.turn, len(self.texts) - 1)]
        if text is None:
            raise PolicyError("the policy's server is down")
        return Generation(text=text)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


async def _solved(farm, bundled_catalog) -> EpisodeResult:
    result = await run_episode(farm, ScriptedPolicy.from_catalog(bundled_catalog), ENV, 0)
    assert result.success and len(result.turns) >= 3
    return result


async def _rule5(farm) -> EpisodeResult:
    """list_tools, then a final answer: no call beyond list_tools (rule 5)."""
    result = await run_episode(farm, Turns(LIST, final_text("All done.", "I give up.")), ENV, 0)
    assert (result.end, result.outcome, result.reward) == (EndReason.final_answer,
                                                           "format_error", -1.0)
    return result


def _advantages_by_episode(samples, episodes) -> list[list[float]]:
    out, k = [], 0
    for e in episodes:
        n = len(e.turns)
        out.append([s.advantage for s in samples[k:k + n]])
        k += n
    assert k == len(samples)
    return out


async def test_a_rule5_minus_one_lands_on_the_violating_turn_only(farm, bundled_catalog,
                                                                  tokenizer):
    solved, rule5 = await _solved(farm, bundled_catalog), await _rule5(farm)
    samples, used = rollout_samples([[solved, rule5]], tokenizer)
    assert used == 1
    good, bad = _advantages_by_episode(samples, [solved, rule5])
    assert good == pytest.approx([1.0] * len(solved.turns), abs=1e-4)
    # the correct list_tools turn carries no credit; the final answer takes the -1's advantage
    assert bad == pytest.approx([0.0, -1.0], abs=1e-4)
    # the verl plugin returns only the violating turn (V1 broadcasts a session's last reward)
    outs = turn_outputs(rule5, tokenizer, reward=-1.0)
    assert [o["extra_fields"]["turn"] for o in outs] == [1]


async def test_an_invalid_episode_is_dropped_from_its_group_never_scored(farm, bundled_catalog,
                                                                        tokenizer):
    solved, rule5 = await _solved(farm, bundled_catalog), await _rule5(farm)
    lost = await run_episode(farm, Turns(LIST, None), ENV, 0)
    assert (lost.end, lost.valid, lost.reward) == (EndReason.policy_error, False, None)
    assert len(lost.turns) == 1  # its list_tools turn was written: it must not become a sample
    samples, used = rollout_samples([[solved, lost, rule5]], tokenizer)
    assert used == 1
    assert len(samples) == len(solved.turns) + len(rule5.turns)
    good, bad = _advantages_by_episode(samples, [solved, rule5])
    # the group is {1.0, -1.0}: advantages +-1 (scored 0.0, the invalid one would make the
    # group {1, -1, 0}: +-1.22, and its turn a sample of advantage 0)
    assert good == pytest.approx([1.0] * len(solved.turns), abs=1e-4)
    assert bad == pytest.approx([0.0, -1.0], abs=1e-4)


async def test_a_group_left_with_one_valid_episode_trains_nothing(farm, bundled_catalog,
                                                                  tokenizer):
    solved = await _solved(farm, bundled_catalog)
    lost = await run_episode(farm, Turns(LIST, None), ENV, 0)
    assert rollout_samples([[solved, lost]], tokenizer) == ([], 0)
