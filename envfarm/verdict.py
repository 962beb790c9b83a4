"""Outcomes, verdicts, the one table that turns an outcome into a reward, and the one rule that
reads a code-mode verifier's answer.

A contract shared by the judge (which decides), the farm (which verifies leases), the acceptance
gate and the SDK (which read verdicts). An environment, verifier or judge failure is not the
agent's doing: it yields an *invalid* verdict (reward ``None``) so a GRPO trainer drops the
rollout instead of learning from a fake 0.
"""

from __future__ import annotations

import os
from enum import Enum
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "COMPLETE",
    "NOT_COMPLETE",
    "REWARDS",
    "EpisodeContext",
    "EpisodeVerifier",
    "Outcome",
    "RewardConfig",
    "RewardPath",
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


#: Where rewards come from: ``code`` (the task's code-mode verifier decides: cheap, for tests)
#: or ``llm`` (the paper's: the sql-mode verifier's output and the trajectory go to an LLM judge).
RewardPath = Literal["code", "llm"]


class RewardConfig(BaseModel):
    """The reward path of a farm or a trainer, and the judge's OpenAI-compatible endpoint."""

    model_config = ConfigDict(extra="forbid")

    path: RewardPath = Field(default="code", description="code | llm")
    llm_base_url: str | None = Field(default=None, description="the judge model's endpoint "
                                     "(default: ENVFARM_JUDGE_BASE_URL, then ENVFARM_LLM_BASE_URL)")
    llm_model: str | None = Field(default=None, description="the judge model (default: "
                                  "ENVFARM_JUDGE_MODEL, then ENVFARM_LLM_MODEL)")

    @classmethod
    def from_env(cls) -> RewardConfig:
        """``ENVFARM_REWARD_PATH`` and the judge endpoint variables (how Serve replicas, which
        build their own farm, learn the path)."""
        return cls(path=os.environ.get("ENVFARM_REWARD_PATH", "code"),  # type: ignore[arg-type]
                   llm_base_url=os.environ.get("ENVFARM_JUDGE_BASE_URL"),
                   llm_model=os.environ.get("ENVFARM_JUDGE_MODEL"))

    def llm_overrides(self) -> dict[str, Any]:
        """``envfarm.llm.LLMConfig`` overrides for the judge's client."""
        return {k: v for k, v in (("base_url", self.llm_base_url), ("model", self.llm_model))
                if v}


class EpisodeContext(BaseModel):
    """What the farm knows of an episode besides its databases; the LLM judge reads it."""

    model_config = ConfigDict(extra="forbid")

    task: str | None = Field(default=None, description="the user task")
    task_idx: int | None = Field(default=None, description="its index in the env")
    scenario: str | None = Field(default=None, description="the env's name")
    trajectory: dict[str, Any] | None = Field(
        default=None, description="the agent's episode (a judge.Trajectory as JSON)")
    sql_code: str | None = Field(default=None, description="the task's sql-mode verifier")
    sql_raw_response: str | None = Field(default=None,
                                         description="its AWM raw_response (criteria)")


class EpisodeVerifier(Protocol):
    """What the farm needs of a verifier (``judge.Judge`` is one): judge an episode of a task
    from its verifier code and its two databases (and, for an LLM judge, the context). Never
    raises for bad verifier code: a verifier that fails gives an invalid verdict."""

    async def verify(self, code: str | None, initial_db: bytes, final_db: bytes, *,
                     final_answer: str | None = None,
                     context: EpisodeContext | None = None) -> Verdict: ...

    async def aclose(self) -> None: ...
