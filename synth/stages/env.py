"""Stage 6: the FastAPI + SQLAlchemy module, accepted only if it loads, lists and answers its tools.

Tools are probed by envfarm's conformance checker (``envfarm.check.probe_tools``). A server error
rejects the code; a tool that fails every schema-valid probe (a 4xx each time: no agent could use
it) is a defect: the code gets one repair round for it, then is accepted with the defect recorded
as a warning (counted in the report's ``defects``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from envfarm.check import probe_tools
from synth import prompts
from synth._context import Meter, RunContext
from synth._correct import Attempt, self_correct
from synth._parse import ParseError, extract_code
from synth._probe import load_runtime, make_bundle
from synth._sql import ddl_text

#: Repair rounds for tools that always answer 4xx before the code is accepted with the defect.
DEFECT_REPAIRS = 1


async def run_env(ctx: RunContext, scenario: dict[str, Any]) -> bool:
    name = scenario["name"]
    st = ctx.stores
    db, sample, spec = st.db.get(name), st.sample.get(name), st.spec.get(name)
    meter = Meter()
    repairs_left = DEFECT_REPAIRS

    async def evaluate(text: str) -> Attempt:
        nonlocal repairs_left
        try:
            code = extract_code(text)
        except ParseError as exc:
            return Attempt(ok=False, errors=[str(exc)])
        bundle = make_bundle(name, db=db, sample=sample, spec=spec, code=code)
        runtime, load_error = await asyncio.to_thread(load_runtime, bundle, ctx.config.tool_timeout_s)
        if runtime is None:
            return Attempt(ok=False, value=code, errors=[load_error or "env does not load"], score=-1e6, excerpt=code)
        rep = await probe_tools(runtime)
        details = {"tools": rep.tools, "code_lines": len(code.splitlines()),
                   "runtime_problems": runtime.problems[:20], "hard_errors": len(rep.errors),
                   "defects": len(rep.defects), "defective_tools": rep.defective_tools}
        ok = not rep.errors and not (rep.defects and repairs_left > 0)
        if not rep.errors and rep.defects and repairs_left > 0:
            repairs_left -= 1
        return Attempt(ok=ok, value=code, errors=rep.errors + rep.defects, excerpt=code, details=details,
                       score=-(1000 * len(rep.errors) + len(rep.defects)))

    loop = await self_correct(ctx, meter, stage="env", scenario=name,
                              messages=prompts.env_messages(name, ddl_text(db["db_schema"]["tables"]), spec["api_spec"]),
                              evaluate=evaluate, executable=True, json_mode=False)
    best = loop.best
    # Out of attempts with only defects left (no server errors): usable, with the defects on record.
    accepted = loop.accepted or bool(best and best.value and best.details.get("hard_errors") == 0)
    if accepted:
        st.env.append_once({"scenario": name, "db_path": f"./outputs/databases/{name}.db", "full_code": best.value})
    ctx.record(meter.report(stage="env", scenario=name, ok=accepted, attempts=loop.attempts,
                            errors=best.errors if best else [], details=best.details if best else {}))
    return accepted
