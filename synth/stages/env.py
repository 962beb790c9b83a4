"""Stage 6: the FastAPI + SQLAlchemy module, accepted only if it loads, lists and answers its tools."""

from __future__ import annotations

import asyncio
from typing import Any

from synth import prompts
from synth._context import Meter, RunContext
from synth._correct import Outcome, self_correct
from synth._parse import ParseError, extract_code
from synth._probe import load_runtime, make_bundle, probe
from synth._sql import ddl_text


async def run_env(ctx: RunContext, scenario: dict[str, Any]) -> bool:
    name = scenario["name"]
    st = ctx.stores
    db, sample, spec = st.db.get(name), st.sample.get(name), st.spec.get(name)
    meter = Meter()

    async def evaluate(text: str) -> Outcome:
        try:
            code = extract_code(text)
        except ParseError as exc:
            return Outcome(ok=False, errors=[str(exc)])
        bundle = make_bundle(name, db=db, sample=sample, spec=spec, code=code)
        runtime, load_error = await asyncio.to_thread(load_runtime, bundle, ctx.config.tool_timeout_s)
        if runtime is None:
            return Outcome(ok=False, value=code, errors=[load_error or "env does not load"], score=-1e6, excerpt=code)
        rep = await probe(runtime, spec["api_spec"])
        return Outcome(ok=not rep.errors, value=code, errors=rep.errors, score=-len(rep.errors), excerpt=code,
                       details={"tools": rep.tools, "code_lines": len(code.splitlines()),
                                "runtime_problems": runtime.problems[:20]})

    loop = await self_correct(ctx, meter, stage="env", scenario=name,
                              messages=prompts.env_messages(name, ddl_text(db["db_schema"]["tables"]), spec["api_spec"]),
                              evaluate=evaluate, executable=True, json_mode=False)
    best = loop.best
    if loop.accepted:
        st.env.append_once({"scenario": name, "db_path": f"./outputs/databases/{name}.db", "full_code": best.value})
    ctx.record(meter.report(stage="env", scenario=name, ok=loop.accepted, attempts=loop.attempts,
                            errors=best.errors if best else [], details=best.details if best else {}))
    return loop.accepted
