"""The OpenEnv endpoint's messages: actions in, AWM-shaped observations out.

Field names and ``reward_type`` values are those of OpenEnv's AWM env (its ``AWMObservation``
forbids any other field, so none is added); step rewards follow its default reward config
(format mistakes -1.0, anything else 0.0, overridable at reset). The reward of ``verify`` is the
farm's verdict (``envfarm.verdict.REWARDS``): null where the env, verifier or judge failed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from envfarm.catalog import Catalog
from envfarm.errors import EnvfarmError, EnvNotFound
from envfarm.verdict import REWARDS, Outcome
from envfarm.wire import LEASE_ID_PATTERN


class ListTools(BaseModel):
    """``ListToolsAction``: the scenario's tools."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["list_tools"] = "list_tools"
    metadata: dict[str, Any] = Field(default_factory=dict)


class CallTool(BaseModel):
    """``CallToolAction``: one tool call (an env tool, or a hidden one)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["call_tool"] = "call_tool"
    tool_name: str = Field(min_length=1, max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


Action = TypeAdapter(Annotated[ListTools | CallTool, Field(discriminator="type")])


class ResetArgs(BaseModel):
    """``reset(**kwargs)``. Unknown keywords are ignored, as AWM's ``reset(**kwargs)`` does
    (clients pass ``seed``, ``llm_*`` …: the farm's own judge decides rewards)."""

    model_config = ConfigDict(extra="ignore")

    scenario: str | None = Field(default=None, max_length=200)
    task_idx: int | None = Field(default=None, ge=0)
    task: str | None = Field(default=None, max_length=100_000,
                             description="A task text of your own (no verifier).")
    reward_config: dict[str, float] | None = None
    episode_id: str | None = Field(default=None, max_length=200)
    lease_id: str | None = Field(default=None, pattern=LEASE_ID_PATTERN, description=(
        "Attach this lease (a fork) instead of making one; its token in lease_token."))
    lease_token: str | None = Field(default=None, max_length=200)


#: Step reward types AWM counts as format errors.
FORMAT_ERROR_TYPES = frozenset({"tool_not_found", "invalid_args", "invalid_action"})
#: AWM's default step-reward config, in AWM's names, taken from the one reward table
#: (``envfarm.verdict.REWARDS``) so the two cannot drift apart.
DEFAULT_REWARDS = {"complete": REWARDS[Outcome.completed],
                   "incomplete": REWARDS[Outcome.partially_completed],
                   "format_error": REWARDS[Outcome.format_error]}


def step_reward(reward_type: str, config: dict[str, float]) -> float:
    rewards = {**DEFAULT_REWARDS, **config}
    if reward_type in FORMAT_ERROR_TYPES:
        return rewards["format_error"]
    return rewards.get(reward_type, 0.0)


def tool_error_type(kind: str, message: str) -> str:
    """A failed call's ``reward_type``, from the farm's typed kind (AWM guesses it from the
    message's words)."""
    if kind == "agent_error":
        return "tool_not_found" if message.lower().startswith("unknown tool") else "invalid_args"
    return "timeout" if "timed out" in message.lower() else "server_error"


def verdict_type(outcome: str, mode: str) -> str:
    """A verdict's ``reward_type``: AWM's words for the farm's outcomes (a code-mode verifier
    that says "not complete" answers ``others``, as AWM's does)."""
    return {"completed": "complete", "partially_completed": "incomplete",
            "agent_error": "others" if mode == "code" else "agent_error",
            "format_error": "format_error", "environment_error": "server_error",
            }.get(outcome, "judge_error")


def error_message(exc: EnvfarmError, scenario: str | None = None) -> str:
    if isinstance(exc, EnvNotFound) and scenario is not None:
        return f"Scenario '{scenario}' not found: {exc.message}"
    return f"{type(exc).__name__}: {exc.message}"


def observation(reward_type: str, *, reward: float | None = None, done: bool = False,
                exc: EnvfarmError | None = None, **fields: Any) -> dict[str, Any]:
    """An AWM observation: set fields only (AWM's ``model_dump`` drops None ones), the reward
    and done beside them, a farm error's kind and class in ``metadata``."""
    obs = {"reward_type": reward_type, **{k: v for k, v in fields.items() if v is not None}}
    if exc is not None:
        obs["metadata"] = {"error_kind": exc.kind.value, "error_type": type(exc).__name__}
    obs["reward"], obs["done"] = reward, done
    return obs


def list_scenarios(catalog: Catalog, served: list[str]) -> list[dict[str, Any]]:
    """``__list_scenarios__``: the scenarios this farm serves, with their tasks."""
    out = []
    for name in served:
        bundle = catalog[name]
        out.append({"name": name, "description": bundle.description,
                    "num_tasks": len(bundle.tasks), "tasks": list(bundle.tasks)})
    return out
