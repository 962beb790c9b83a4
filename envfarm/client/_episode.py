"""A reference episode: lease -> list tools -> reference solution -> verify -> release."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from envfarm.client._client import Farm
from envfarm.models import ToolCall
from envfarm.wire import VerifyResponse


class StepReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str
    ok: bool
    summary: str = Field(description="Short text of the result or error.")


class EpisodeReport(BaseModel):
    """What happened in one reference episode."""

    model_config = ConfigDict(extra="forbid")

    env: str
    task_idx: int
    task: str | None
    lease_id: str
    tools: int
    steps: list[StepReport]
    verdict: VerifyResponse
    release: str
    seconds: float


async def reference_episode(farm: Farm, env: str, task_idx: int,
                            solution: list[ToolCall], final_answer: str | None = None) -> EpisodeReport:
    """Replays ``solution`` on a fresh lease and verifies it; ``final_answer`` is the task's stored
    reference answer (``EnvBundle.solution_answers``), which read-only tasks' verifiers check."""
    started = time.perf_counter()
    lease = await farm.acquire(env, task_idx=task_idx)
    try:
        tools = await lease.tools()
        steps = []
        for call in solution:
            res = await lease.call_result(call.tool, call.arguments)
            text = _short(res.result if res.ok else (res.error.message if res.error else ""))
            steps.append(StepReport(tool=call.tool, ok=res.ok, summary=text))
        verdict = await lease.verify(final_answer=final_answer)
    finally:
        released = await lease.release()
    return EpisodeReport(env=env, task_idx=task_idx, task=lease.info.task, lease_id=lease.lease_id,
                         tools=len(tools), steps=steps, verdict=verdict,
                         release=released.status.value, seconds=time.perf_counter() - started)


def _short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
