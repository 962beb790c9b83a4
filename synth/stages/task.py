"""Stage 2: k concrete, API-solvable tasks per scenario."""

from __future__ import annotations

from typing import Any

from synth import prompts
from synth._context import Meter, RunContext
from synth._correct import Attempt, self_correct
from synth._answers import TaskAnswer, parse_answer
from synth._parse import ParseError


async def run_task(ctx: RunContext, scenario: dict[str, Any]) -> bool:
    name, k = scenario["name"], ctx.config.tasks_per_scenario
    meter = Meter()

    async def evaluate(text: str) -> Attempt:
        try:
            tasks = parse_answer(text, TaskAnswer).tasks
        except ParseError as exc:
            return Attempt(ok=False, errors=[str(exc)])
        tasks = [t.strip() for t in tasks if t.strip()]
        errors = []
        if len(tasks) != k:
            errors.append(f"expected exactly {k} tasks, got {len(tasks)}")
        if len(set(tasks)) != len(tasks):
            errors.append("tasks must be distinct")
        short = [t for t in tasks if len(t) < 20]
        if short:
            errors.append(f"tasks too short to carry concrete parameters: {short[:3]}")
        return Attempt(ok=not errors, value=tasks[:k], errors=errors, score=-len(errors))

    loop = await self_correct(ctx, meter, stage="task", scenario=name,
                              messages=prompts.task_messages(name, scenario.get("description", ""), k),
                              evaluate=evaluate, executable=False)
    if loop.accepted:
        ctx.stores.task.append_once({"scenario": name, "tasks": loop.best.value})
    ctx.record(meter.report(stage="task", scenario=name, ok=loop.accepted, attempts=loop.attempts,
                            errors=[] if loop.accepted else loop.last_errors))
    return loop.accepted
