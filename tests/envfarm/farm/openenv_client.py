"""openenv-core's ``MCPToolClient`` reading observations as OpenEnv's ``AWMEnv`` does: only
``_parse_result`` is replaced, by a strict model of the observation fields OpenEnv's AWM env
documents (any other field fails). Needs openenv-core."""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_server.mcp_types import ListToolsObservation
from openenv.core.env_server.types import Observation
from openenv.core.mcp_client import MCPToolClient
from pydantic import ConfigDict


class AWMFields(Observation):
    """The observation fields of OpenEnv's AWM env (its README's table), nothing else."""

    model_config = ConfigDict(extra="forbid")

    reward_type: str | None = None
    scenario: str | None = None
    task: str | None = None
    task_idx: int | None = None
    has_verifier: dict | None = None
    num_tools: int | None = None
    tool_name: str | None = None
    tool_result: Any = None
    error: str | None = None
    warning: str | None = None
    verify_result: dict | None = None
    steps_taken: int | None = None
    scenarios: list | None = None
    total: int | None = None
    trajectory_path: str | None = None
    session_dir: str | None = None


class AWMListTools(ListToolsObservation):
    """A tool listing: ``tools`` (each exactly name, description, input_schema) and ``error``."""

    model_config = ConfigDict(extra="forbid")

    error: str | None = None


class AWMShaped(MCPToolClient):
    def _parse_result(self, payload: dict[str, Any]) -> StepResult:
        fields = payload.get("observation", {})
        model = AWMListTools if "tools" in fields else AWMFields
        return StepResult(observation=model(**fields), reward=payload.get("reward"),
                          done=payload.get("done", False))
