"""The one outcome → reward table, and verdicts that cannot carry a fake 0."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from judge import REWARDS, Outcome, Verdict, reward_for


def test_reward_table():
    assert reward_for(Outcome.completed) == 1.0
    assert reward_for("partially_completed") == 0.1
    assert reward_for(Outcome.agent_error) == 0.0
    assert reward_for(Outcome.format_error) == -1.0
    assert reward_for(Outcome.environment_error) is None
    assert reward_for(Outcome.invalid) is None
    assert set(REWARDS) == set(Outcome)


@pytest.mark.parametrize("outcome", list(Outcome))
def test_verdict_reward_follows_outcome(outcome):
    v = Verdict.of(outcome, "why")
    assert v.reward == reward_for(outcome)
    assert v.valid is (v.reward is not None)


@pytest.mark.parametrize("outcome", [Outcome.environment_error, Outcome.invalid])
def test_invalid_verdicts_never_say_zero(outcome):
    # Even a caller (or a wire payload) claiming 0.0 gets null: GRPO must drop these.
    v = Verdict.model_validate({"outcome": outcome.value, "reward": 0.0, "valid": True})
    assert v.reward is None and v.valid is False
    assert '"reward":null' in v.model_dump_json()


def test_unknown_outcome_and_extra_fields_are_rejected():
    with pytest.raises(ValidationError):
        Verdict.model_validate({"outcome": "great"})
    with pytest.raises(ValidationError):
        Verdict.model_validate({"outcome": "completed", "bonus": 1})


def test_assignment_is_checked():
    v = Verdict.of(Outcome.completed)
    with pytest.raises(ValidationError):
        v.reward = 0.5
    with pytest.raises(ValidationError):
        v.valid = False
    assert v.reward == 1.0 and v.valid  # a refused assignment changes nothing
    bad = Verdict.of(Outcome.invalid)
    with pytest.raises(ValidationError):
        bad.reward = 0.0
    assert bad.reward is None and not bad.valid
    v.outcome = Outcome.environment_error  # reward and validity follow the outcome
    assert v.reward is None and not v.valid
