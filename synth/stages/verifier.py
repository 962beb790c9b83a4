"""Stage 7: per-task sql/code verifiers run in the sandbox, then the acceptance gate.

The gate (beyond AWM) asks for a reference solution, runs it on a fresh instance, and accepts the
task only if the code-mode verifier says "complete" after it and not after a no-op. Otherwise it
repairs the solution or the verifier (the LLM's error summary picks which) within the budget, or
drops the task with its reasons. Only accepted tasks get verifier and solution records.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from envfarm import EnvRuntime
from envfarm.check import check_solution
from envfarm.models import ToolCall
from synth import prompts
from synth._context import Meter, RunContext
from synth._correct import LoopResult, Outcome, self_correct, summarize
from synth._parse import ParseError, extract_json
from synth._probe import load_runtime, make_bundle
from synth._sql import ddl_text


@dataclass
class GateCheck:
    """One run of a reference solution plus the two verdicts."""

    solvable: bool = False
    discriminates: bool = False
    evaluated: bool = False  # the verifier got to judge (the solution's calls all succeeded)
    calls_failed: bool = False
    reason: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.solvable and self.discriminates


def task_done(ctx: RunContext, name: str, idx: int) -> bool:
    rec = ctx.stores.report.get(("gate", name, idx))
    if rec is None:
        return False
    return bool(rec["ok"]) or not ctx.config.retry_failed


async def run_verifier(ctx: RunContext, scenario: dict[str, Any]) -> bool:
    name = scenario["name"]
    st = ctx.stores
    tasks: list[str] = st.task.get(name)["tasks"]
    todo = [i for i in range(len(tasks)) if not task_done(ctx, name, i)]
    if not todo:
        return any(st.report.get(("gate", name, i), {}).get("ok") for i in range(len(tasks)))
    db, sample, spec, env = st.db.get(name), st.sample.get(name), st.spec.get(name), st.env.get(name)
    bundle = make_bundle(name, db=db, sample=sample, spec=spec, code=env["full_code"], tasks=tasks)
    runtime, err = await asyncio.to_thread(load_runtime, bundle, ctx.config.tool_timeout_s)
    if runtime is None:
        for i in todo:
            ctx.record(Meter().report(stage="gate", scenario=name, task_idx=i, ok=False, errors=[err or "env does not load"]))
        return False
    shared = _Shared(
        name=name,
        ddl=ddl_text(db["db_schema"]["tables"]),
        sample=_sample_excerpt(sample),
        tools=json.dumps([t.model_dump() for t in runtime.tools], indent=None)[:12000],
        initial=runtime.template.data,
    )
    results = await asyncio.gather(*(_one_task(ctx, runtime, shared, i, tasks[i]) for i in todo))
    return any(results) or any(st.report.get(("gate", name, i), {}).get("ok") for i in range(len(tasks)))


@dataclass
class _Shared:
    name: str
    ddl: str
    sample: str
    tools: str
    initial: bytes


async def _one_task(ctx: RunContext, runtime: EnvRuntime, sh: _Shared, idx: int, task: str) -> bool:
    cfg = ctx.config
    vmeter = Meter()
    vloop = await _gen_verifier(ctx, vmeter, sh, idx, task, feedback=None)
    best = vloop.best
    ctx.record(vmeter.report(stage="verifier", scenario=sh.name, task_idx=idx, ok=vloop.accepted,
                             attempts=vloop.attempts, errors=best.errors if best else []))
    if not vloop.accepted:
        ctx.record(Meter().report(stage="gate", scenario=sh.name, task_idx=idx, ok=False,
                                  errors=["no verifier that runs"], details={"solvable": False, "discriminates": None}))
        return False
    verifier: dict[str, Any] = vloop.best.value
    if not cfg.gate:
        _write_verifiers(ctx, sh.name, idx, task, verifier)
        ctx.record(Meter().report(stage="gate", scenario=sh.name, task_idx=idx, ok=True, details={"skipped": True}))
        return True
    gmeter = Meter()
    reasons: list[str] = []
    sol_feedback: str | None = None
    check = GateCheck()
    for attempt in range(1, cfg.gate_attempts + 1):
        messages = prompts.solution_messages(sh.name, task, sh.tools, sh.sample)
        if sol_feedback:
            messages = [*messages, {"role": "user", "content": sol_feedback}]
        text = await ctx.chat(gmeter, messages, stage="gate", scenario=sh.name, temperature=cfg.fix_temperature)
        try:
            solution = _parse_solution(text)
        except ParseError as exc:
            reasons.append(f"attempt {attempt}: unusable solution: {exc}")
            sol_feedback = prompts.retry_message("solution", attempt, f"- {exc}")
            continue
        check = await _check(ctx, runtime, verifier["code"], solution)
        if check.ok:
            _write_verifiers(ctx, sh.name, idx, task, verifier)
            ctx.stores.solution.append_once({"scenario": sh.name, "task_idx": idx,
                                             "solution": [c.model_dump() for c in solution]})
            ctx.record(gmeter.report(stage="gate", scenario=sh.name, task_idx=idx, ok=True, attempts=attempt,
                                     errors=reasons, details={"solvable": True, "discriminates": True,
                                                              "solution_calls": len(solution)}))
            return True
        reasons.append(f"attempt {attempt}: {check.reason}")
        if attempt == cfg.gate_attempts:
            break  # no repair left to inform
        summary = await summarize(
            ctx, gmeter, stage="gate", scenario=sh.name, errors=[check.reason],
            excerpt=f"Verifier (code mode):\n{verifier['code']}\n\nReference solution:\n"
                    f"{json.dumps([c.model_dump() for c in solution])}",
            extra=f"Task: {task}\nTool call log: {json.dumps(check.calls)[:3000]}",
        )
        target = summary.get("fix_target") or ("solution" if check.calls_failed else "verifier")
        feedback = prompts.format_summary(summary) + f"\n\nWhat happened: {check.reason}"
        if target == "verifier" and not check.calls_failed:
            vfix = await _gen_verifier(ctx, gmeter, sh, idx, task, feedback=feedback)
            if vfix.accepted:
                verifier = vfix.best.value
            sol_feedback = None
        else:
            sol_feedback = prompts.retry_message("solution", attempt, feedback)
    ctx.record(gmeter.report(stage="gate", scenario=sh.name, task_idx=idx, ok=False, attempts=cfg.gate_attempts,
                             errors=reasons or ["gate budget spent"],
                             details={"solvable": check.solvable,
                                      "discriminates": check.discriminates if check.evaluated else None,
                                      "dropped": True}))
    return False


async def _gen_verifier(ctx: RunContext, meter: Meter, sh: _Shared, idx: int, task: str,
                        feedback: str | None) -> LoopResult:
    sandbox = ctx.get_sandbox()

    async def evaluate(text: str) -> Outcome:
        try:
            data = extract_json(text)
        except ParseError as exc:
            return Outcome(ok=False, errors=[str(exc)])
        sql_code, code_code = data.get("sql_verifier"), data.get("code_verifier")
        if not isinstance(sql_code, str) or not isinstance(code_code, str):
            return Outcome(ok=False, errors=['"sql_verifier" and "code_verifier" must both be code strings'])
        initial = sh.initial
        errors = []
        sql_res = await sandbox.run(sql_code, initial, initial, mode="sql")
        if not sql_res.ok:
            errors.append(f"sql-mode verify_task on the initial database: {sql_res.error}")
        code_res = await sandbox.run(code_code, initial, initial, mode="code")
        if not code_res.ok:
            errors.append(f"code-mode verify_task_completion on the initial database: {code_res.error}")
        elif code_res.code_result not in ("complete", "others"):
            errors.append(f"code-mode verifier returned {code_res.result!r}; it must return "
                          '{"result": "complete"} or {"result": "others"}')
        criteria = {k: str(data.get(k, "")) for k in ("reasoning", "success_criteria", "failure_criteria")}
        return Outcome(ok=not errors, value={"sql": sql_code, "code": code_code, "criteria": criteria},
                       errors=errors, score=-len(errors), excerpt=f"{sql_code}\n\n{code_code}")

    messages = prompts.verifier_messages(sh.name, task, sh.ddl, sh.sample, sh.tools)
    if feedback:
        messages = [*messages, {"role": "user", "content": "A previous verifier for this task judged a reference "
                                "run wrongly. Write corrected verifiers.\n" + feedback}]
    return await self_correct(ctx, meter, stage="verifier", scenario=sh.name, messages=messages,
                              evaluate=evaluate, executable=True)


async def _check(ctx: RunContext, runtime: EnvRuntime, code: str, solution: list[ToolCall]) -> GateCheck:
    """The conformance checker's verdict on one (verifier, reference solution) pair."""
    tc = await check_solution(runtime, code, solution, ctx.get_sandbox())
    return GateCheck(
        solvable=tc.solution_result == "complete",
        discriminates=tc.evaluated and tc.noop_result is not None and tc.noop_result != "complete",
        evaluated=tc.evaluated, calls_failed=tc.calls_failed,
        reason="; ".join(tc.problems), calls=tc.calls,
    )


def _parse_solution(text: str) -> list[ToolCall]:
    data = extract_json(text)
    raw = data.get("solution")
    if not isinstance(raw, list):
        raise ParseError('"solution" must be a list of {"tool", "arguments"}')
    try:
        return [ToolCall.model_validate({"tool": c.get("tool"), "arguments": c.get("arguments") or {}}) for c in raw]
    except (ValueError, AttributeError) as exc:
        raise ParseError(f"bad tool call in solution: {exc}") from exc


def _write_verifiers(ctx: RunContext, name: str, idx: int, task: str, v: dict[str, Any]) -> None:
    # raw_response is AWM's JSON of criteria plus the function the code defines, per mode.
    sql_raw = json.dumps({"function_name": "verify_task", **v["criteria"]})
    code_raw = json.dumps({"function_name": "verify_task_completion", **v["criteria"]})
    ctx.stores.verifier.append_once({"scenario": name, "task_idx": idx, "task": task,
                                     "verification": {"code": v["sql"], "raw_response": sql_raw}})
    ctx.stores.code_verifier.append_once({"scenario": name, "task_idx": idx, "task": task,
                                          "verification": {"code": v["code"], "raw_response": code_raw}})


def _sample_excerpt(sample: dict[str, Any], limit: int = 6000) -> str:
    lines = [s for t in sample["sample_data"]["tables"] for s in t["insert_statements"]]
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit] + "\n-- (more rows omitted)"
