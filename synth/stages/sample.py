"""Stage 4: sample rows, inserted in foreign-key order; accepted when at most 10 % fail."""

from __future__ import annotations

import asyncio
from typing import Any

from synth import prompts
from synth._context import Meter, RunContext
from synth._correct import Outcome, self_correct
from synth._parse import ParseError, extract_json
from synth._sql import ddl_text, run_inserts


async def run_sample(ctx: RunContext, scenario: dict[str, Any]) -> bool:
    name = scenario["name"]
    tasks = ctx.stores.task.get(name)["tasks"]
    db_tables = ctx.stores.db.get(name)["db_schema"]["tables"]
    meter = Meter()

    async def evaluate(text: str) -> Outcome:
        try:
            tables = extract_json(text).get("tables")
        except ParseError as exc:
            return Outcome(ok=False, errors=[str(exc)])
        if not isinstance(tables, list) or not tables:
            return Outcome(ok=False, errors=['"tables" must be a non-empty list'])
        tables = [
            {"table_name": str(t.get("table_name", "")), "reasoning": str(t.get("reasoning", "")),
             "insert_statements": [s for s in t.get("insert_statements", []) if isinstance(s, str)]}
            for t in tables if isinstance(t, dict)
        ]
        run = await asyncio.to_thread(run_inserts, db_tables, tables)
        ok = run.total > 0 and run.failure_rate <= ctx.config.max_failure_rate
        return Outcome(ok=ok, value=run, errors=run.errors, score=-run.failure_rate,
                       excerpt="\n".join(e.split("): ", 1)[-1] for e in run.errors[:20]) or text,
                       details={"inserts": run.rows, "failed": run.failed, "total": run.total})

    loop = await self_correct(ctx, meter, stage="sample", scenario=name,
                              messages=prompts.sample_messages(name, tasks, ddl_text(db_tables)),
                              evaluate=evaluate, executable=True)
    best = loop.best
    if loop.accepted:
        kept = [t for t in best.value.kept if t["insert_statements"]]
        ctx.stores.sample.append_once({"scenario": name, "tables_count": len(kept), "inserts_count": best.value.rows,
                                       "sample_data": {"tables": kept}})
    ctx.record(meter.report(stage="sample", scenario=name, ok=loop.accepted, attempts=loop.attempts,
                            errors=best.errors if best else [], details=best.details if best else {}))
    return loop.accepted
