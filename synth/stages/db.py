"""Stage 3: SQLite schema, executed for real; accepted when at most 10 % of tables fail."""

from __future__ import annotations

import asyncio
from typing import Any

from synth import prompts
from synth._context import Meter, RunContext
from synth._correct import Attempt, self_correct
from synth._answers import DbAnswer, parse_answer
from synth._parse import ParseError
from synth._sql import run_ddl


async def run_db(ctx: RunContext, scenario: dict[str, Any]) -> bool:
    name = scenario["name"]
    tasks = ctx.stores.task.get(name)["tasks"]
    meter = Meter()

    async def evaluate(text: str) -> Attempt:
        try:
            tables = [t.model_dump() for t in parse_answer(text, DbAnswer).tables]
        except ParseError as exc:
            return Attempt(ok=False, errors=[str(exc)])
        run = await asyncio.to_thread(run_ddl, tables)
        ok = run.failure_rate <= ctx.config.max_failure_rate and bool(run.kept)
        return Attempt(ok=ok, value=run, errors=run.errors, score=-run.failure_rate,
                       excerpt="\n".join(t["ddl"] for t in tables if t["name"] in run.failed_tables) or text,
                       details={"tables": len(run.kept), "failed_tables": run.failed_tables})

    loop = await self_correct(ctx, meter, stage="db", scenario=name,
                              messages=prompts.db_messages(name, scenario.get("description", ""), tasks),
                              evaluate=evaluate, executable=True)
    best = loop.best
    if loop.accepted:
        ctx.stores.db.append_once({"scenario": name, "db_schema": {"tables": best.value.kept},
                                   "db_path": f"./outputs/databases/{name}.db"})
    ctx.record(meter.report(stage="db", scenario=name, ok=loop.accepted, attempts=loop.attempts,
                            errors=best.errors if best else [], details=best.details if best else {}))
    return loop.accepted
