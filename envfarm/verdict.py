"""Outcomes, verdicts, the one table that turns an outcome into a reward, and the one rule that
reads a code-mode verifier's answer.

A contract shared by the judge (which decides), the farm (which verifies leases), the acceptance
gate and the SDK (which read verdicts). An environment, verifier or judge failure is not the
agent's doing: it yields an *invalid* verdict (reward ``None``) so a GRPO trainer drops the
rollout instead of learning from a fake 0.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "COMPLETE",
    "NOT_COMPLETE",
    "REWARDS",
    "EpisodeVerifier",
    "Outcome",
    "Verdict",
    "code_result_outcome",
    "reward_for",
]


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

#: What a code-mode verifier returns in ``result`` (AWM: ``"complete"`` or ``"others"``).
COMPLETE = "complete"
NOT_COMPLETE = "others"


def reward_for(outcome: Outcome | str) -> float | None:
    """The reward of an outcome; ``None`` for environment, verifier and judge failures."""
    return REWARDS[Outcome(outcome)]


def code_result_outcome(value: object) -> Outcome:
    """THE conformance rule for a code-mode verifier's ``result``: ``"complete"`` is completed,
    ``"others"`` is not; anything else (``None``, ``"error"``, a number…) says nothing about the
    agent, so the episode is invalid. Case and surrounding blanks are ignored."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word == COMPLETE:
            return Outcome.completed
        if word == NOT_COMPLETE:
            return Outcome.agent_error
    return Outcome.invalid


class Verdict(BaseModel):
    """The judgment of one episode. ``reward`` and ``valid`` always follow from ``outcome``,
    on construction and on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

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
            raise ValueError("reward/valid must follow from outcome (see reward_for)")
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        # Pydantic stores an assigned value before the model check runs, and keeps it when the
        # check fails; put the verdict back so a refused ``v.reward = 0.5`` changes nothing.
        before = dict(self.__dict__)
        try:
            super().__setattr__(name, value)
        except ValidationError:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise

    @classmethod
    def of(cls, outcome: Outcome, reason: str = "", **fields: Any) -> Verdict:
        """A verdict with reward and validity filled in from ``outcome``."""
        return cls(outcome=outcome, reason=reason, **fields)


class EpisodeVerifier(Protocol):
    """What the farm needs of a verifier (``judge.Judge`` is one): judge an episode of a task
    from its verifier code and its two databases. Never raises for bad verifier code: a
    verifier that fails gives an invalid verdict."""

    async def verify(self, code: str | None, initial_db: bytes, final_db: bytes, *,
                     final_answer: str | None = None) -> Verdict: ...

    async def aclose(self) -> None: ...
