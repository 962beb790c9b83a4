"""Outcomes, verdicts, and the one table that turns an outcome into a reward.

An environment, verifier or judge failure is not the agent's doing: it yields an *invalid*
verdict (reward ``None``) so a GRPO trainer drops the rollout instead of learning from a fake 0.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Outcome(str, Enum):
    """How an episode ended, as judged."""

    completed = "completed"
    partially_completed = "partially_completed"
    agent_error = "agent_error"
    environment_error = "environment_error"
    format_error = "format_error"
    invalid = "invalid"  # the verifier or the judge failed: no verdict on the agent


#: THE mapping from outcome to reward. ``None`` means "invalid: do not train on this".
REWARDS: dict[Outcome, float | None] = {
    Outcome.completed: 1.0,
    Outcome.partially_completed: 0.1,
    Outcome.agent_error: 0.0,
    Outcome.format_error: -1.0,  # early termination on a malformed trajectory (paper A.4)
    Outcome.environment_error: None,
    Outcome.invalid: None,
}


def reward_for(outcome: Outcome | str) -> float | None:
    """The reward of an outcome; ``None`` for environment, verifier and judge failures."""
    return REWARDS[Outcome(outcome)]


class Verdict(BaseModel):
    """The judgment of one episode. ``reward`` and ``valid`` always follow from ``outcome``."""

    model_config = ConfigDict(extra="forbid")

    outcome: Outcome = Field(description="how the episode ended")
    reward: float | None = Field(default=None,
                                 description="reward for the trainer; null when not valid")
    valid: bool = Field(default=True, description="false: drop the rollout, do not score it")
    reason: str = Field(default="", description="one line on why")
    error_kind: str | None = Field(
        default=None, description="env_error / verifier_error / judge_error when not valid")
    confidence: float | None = Field(default=None, ge=0, le=1,
                                     description="the LLM judge's confidence, if it judged")
    details: dict[str, Any] = Field(default_factory=dict,
                                    description="verifier output, judge reasoning, evidence …")

    @model_validator(mode="before")
    @classmethod
    def _derive_reward(cls, data: Any) -> Any:
        if isinstance(data, dict) and "outcome" in data:
            reward = reward_for(data["outcome"])
            data = {**data, "reward": reward, "valid": reward is not None}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Verdict:
        if self.reward != reward_for(self.outcome) or self.valid != (self.reward is not None):
            raise ValueError("reward/valid must follow from outcome (see judge.reward_for)")
        return self

    @classmethod
    def of(cls, outcome: Outcome, reason: str = "", **fields: Any) -> Verdict:
        """A verdict with reward and validity filled in from ``outcome``."""
        return cls(outcome=outcome, reason=reason, **fields)
