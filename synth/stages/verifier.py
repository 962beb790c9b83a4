"""Stage 7: per-task sql/code verifiers run in the sandbox, then the acceptance gate.

The gate (beyond AWM) asks for a reference solution (tool calls plus, for tasks that ask for
information, a final answer), runs it on a fresh instance, and accepts the task only if the
code-mode verifier says "complete" after it (given the final answer) and not after a no-op (no
answer), the sql-mode verifier returns facts the LLM judge can use to tell the two apart
(``envfarm.check.check_solution``), and no hack probe passes the code-mode verifier
(``envfarm.hackprobes``: echo, guesses, a dump, a destructive write beside the reference...; a
probe that passes sends the verifier back for repair with what it let through). The accepted
code-mode verifier is first guarded (``synth.guard``: rows the reference does not touch must stay
as they were), so a destructive write beside the right answer fails mechanically. Otherwise it
repairs the solution, the verifier or the sample data (the LLM's error summary picks which) within
the budget, or drops the task with its reasons. Only accepted tasks get verifier and solution records.

A data repair asks for extra INSERTs, runs them for real on the current data, rebuilds the env on
it and re-checks the task; the rows are committed only when the task passes and every task of the
scenario accepted so far still passes on them (persistence: see ``synth.stages.sample``).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from envfarm import EnvRuntime
from envfarm.check import check_solution
from envfarm.hackprobes import ProbeTask, probe_task
from envfarm.models import ToolCall
from judge import Judge, JudgeConfig
from synth import prompts
from synth._answers import RowsAnswer, SolutionAnswer, VerifierAnswer, fix_target, parse_answer
from synth._context import Meter, RunContext
from synth._correct import Attempt, LoopResult, self_correct, summarize
from synth._parse import ParseError
from synth._probe import load_runtime, make_bundle
from synth._sql import ddl_text
from synth.guard import guard_code, read_written_tables, touched_by
from synth.report import gate_skipped
from synth.stages.sample import (
    effective_sample,
    finalize_sample,
    merge_tables,
    patch_store,
    patches,
    run_extra_inserts,
)

#: LLM tries per data repair to get INSERTs that run (each gate attempt may ask for one repair).
DATA_ATTEMPTS = 2


@dataclass
class GateCheck:
    """One run of a reference solution plus the two verdicts."""

    solvable: bool = False
    discriminates: bool = False
    evaluated: bool = False  # the verifier got to judge (the solution's calls all succeeded)
    calls_failed: bool = False
    sql_ok: bool = True  # the sql-mode verifier gave the judge usable facts on the solved episode
    reason: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    data_rejected: bool = False  # the task's extra rows do not go in, or break accepted tasks
    data_commit: dict[str, Any] | None = None  # the repair this acceptance committed
    hackable: bool = False  # a hack probe passes the code-mode verifier (or it cannot judge one)
    guarded_code: str | None = None  # the code-mode verifier, guarded against collateral writes

    @property
    def ok(self) -> bool:
        return self.solvable and self.discriminates and self.sql_ok and not self.data_rejected and not self.hackable


def task_done(ctx: RunContext, name: str, idx: int) -> bool:
    rec = ctx.stores.report.get(("gate", name, idx))
    if rec is None:
        return False
    if gate_skipped(rec):
        return not ctx.config.gate  # a gated run checks what a --no-gate run left unverified
    return bool(rec["ok"]) or not ctx.config.retry_failed


def _forget_unverified(ctx: RunContext, name: str, idx: int) -> None:
    """Drop what a --no-gate run wrote for a task, so the gate decides it afresh. Verifiers go
    first, the gate record last: a kill in between leaves the task unverified, to be redone."""
    st = ctx.stores
    if gate_skipped(st.report.get(("gate", name, idx)) or {}):
        st.verifier.remove((name, idx))
        st.code_verifier.remove((name, idx))
        st.report.remove(("verifier", name, idx))
        st.report.remove(("gate", name, idx))


async def run_verifier(ctx: RunContext, scenario: dict[str, Any]) -> bool:
    name = scenario["name"]
    st = ctx.stores
    tasks: list[str] = st.task.get(name)["tasks"]
    todo = [i for i in range(len(tasks)) if not task_done(ctx, name, i)]
    if not todo:
        finalize_sample(ctx, name)  # a kill may have come between the last repair and the rewrite
        return any(st.report.get(("gate", name, i), {}).get("ok") for i in range(len(tasks)))
    db, spec, env = st.db.get(name), st.spec.get(name), st.env.get(name)
    sample = effective_sample(ctx, name)  # repairs of an interrupted run count already
    bundle = make_bundle(name, db=db, sample=sample, spec=spec, code=env["full_code"], tasks=tasks)
    runtime, err = await asyncio.to_thread(load_runtime, bundle, ctx.config.tool_timeout_s)
    if runtime is None:
        for i in todo:
            ctx.record(Meter().report(stage="gate", scenario=name, task_idx=i, ok=False, errors=[err or "env does not load"]))
        return False
    shared = _Shared(
        name=name, ddl=ddl_text(db["db_schema"]["tables"]),
        tools=json.dumps([t.model_dump() for t in runtime.tools], indent=None)[:12000],
        db=db, spec=spec, code=env["full_code"], tasks=tasks, sample=sample, runtime=runtime,
        accepted=_accepted_before(ctx, name, len(tasks)),
    )
    try:
        results = await asyncio.gather(*(_one_task(ctx, shared, i, tasks[i]) for i in todo))
    finally:
        finalize_sample(ctx, name)
    return any(results) or any(st.report.get(("gate", name, i), {}).get("ok") for i in range(len(tasks)))


@dataclass
class Solution:
    """A reference solution: the tool calls, and the answer the agent gives at the end (read-only
    tasks, "what is ...?", are judged on it)."""

    calls: list[ToolCall]
    final_answer: str | None = None

    def record(self, name: str, idx: int) -> dict[str, Any]:
        return {"scenario": name, "task_idx": idx, "solution": [c.model_dump() for c in self.calls],
                "final_answer": self.final_answer}


@dataclass
class _Accepted:
    """What proved a task solvable: both verifiers and the reference solution."""

    code: str
    sql: str | None
    solution: Solution


@dataclass
class _Shared:
    """What the tasks of one scenario share. The committed data (``sample``, ``runtime``) and the
    accepted tasks change together, under ``lock``: every gate check runs under it too, so a task is
    accepted on exactly the data that gets persisted."""

    name: str
    ddl: str
    tools: str
    db: dict[str, Any]
    spec: dict[str, Any]
    code: str
    tasks: list[str]
    sample: dict[str, Any]
    runtime: EnvRuntime
    accepted: dict[int, _Accepted]  # task -> what proved it solvable
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def initial(self) -> bytes:
        return self.runtime.template.data

    def excerpt(self, extra: list[dict[str, Any]] | None = None) -> str:
        text = _sample_excerpt(self.sample)
        if extra:
            text += "\n-- rows added for this task:\n" + "\n".join(s for t in extra for s in t["insert_statements"])
        return text


def _accepted_before(ctx: RunContext, name: str, n: int) -> dict[int, _Accepted]:
    """Tasks an earlier run accepted (with a reference solution): new data must keep them solvable."""
    st = ctx.stores
    out = {}
    for i in range(n):
        rec, ver, sol = st.report.get(("gate", name, i)), st.code_verifier.get((name, i)), st.solution.get((name, i))
        sql = st.verifier.get((name, i))
        if rec and rec["ok"] and ver and sol:
            out[i] = _Accepted(code=ver["verification"]["code"],
                               sql=sql["verification"]["code"] if sql else None,
                               solution=Solution([ToolCall.model_validate(c) for c in sol["solution"]],
                                                 sol.get("final_answer")))
    return out


async def _one_task(ctx: RunContext, sh: _Shared, idx: int, task: str) -> bool:
    cfg = ctx.config
    if cfg.gate:
        _forget_unverified(ctx, sh.name, idx)
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
    gmeter, dmeter = Meter(), Meter()
    reasons: list[str] = []
    data_errors: list[str] = []
    data_tries = 0
    sol_feedback: str | None = None
    check = GateCheck()
    solution: Solution | None = None
    extra: list[dict[str, Any]] | None = None  # rows this task asked for, not committed yet
    for attempt in range(1, cfg.gate_attempts + 1):
        if solution is None:
            messages = prompts.solution_messages(sh.name, task, sh.tools, sh.excerpt(extra))
            if sol_feedback:
                messages = [*messages, {"role": "user", "content": sol_feedback}]
            text = await ctx.chat(gmeter, messages, stage="gate", scenario=sh.name, temperature=cfg.fix_temperature)
            try:
                solution = _parse_solution(text)
            except ParseError as exc:
                reasons.append(f"attempt {attempt}: unusable solution: {exc}")
                sol_feedback = prompts.retry_message("solution", attempt, f"- {exc}")
                continue
        check = await _gate_check(ctx, sh, idx, task, verifier, solution, extra)
        if check.ok:
            details: dict[str, Any] = {"solvable": True, "discriminates": True, "sql_usable": True,
                                       "solution_calls": len(solution.calls),
                                       "final_answer": solution.final_answer is not None}
            # An interrupted run may have committed this task's rows and died before reporting them.
            commit = check.data_commit or next((p for p in reversed(patches(ctx, sh.name)) if p["task_idx"] == idx), None)
            if data_tries or commit:
                commit = commit or {}
                details["data_rows_added"] = commit.get("rows", 0)
                ctx.record(dmeter.report(stage="data_repair", scenario=sh.name, task_idx=idx, ok=bool(commit),
                                         attempts=data_tries, errors=data_errors,
                                         details={"rows_added": commit.get("rows", 0), "seq": commit.get("seq"),
                                                  "rechecked_tasks": commit.get("rechecked", [])}))
            ctx.record(gmeter.report(stage="gate", scenario=sh.name, task_idx=idx, ok=True, attempts=attempt,
                                     errors=reasons, details=details))
            return True
        reasons.append(f"attempt {attempt}: {check.reason}")
        if check.data_rejected:
            data_errors.append(f"attempt {attempt}: {check.reason}")
            extra = None
        if attempt == cfg.gate_attempts:
            break  # no repair left to inform
        summary = await summarize(
            ctx, gmeter, stage="gate", scenario=sh.name, errors=[check.reason],
            excerpt=f"Verifier (code mode):\n{verifier['code']}\n\nVerifier (sql mode):\n{verifier['sql']}\n\n"
                    f"Reference solution:\n{json.dumps(solution.record(sh.name, idx))}",
            extra=f"Task: {task}\nTool call log: {json.dumps(check.calls)[:3000]}",
        )
        target = fix_target(summary) or ("solution" if check.calls_failed else "verifier")
        if check.solvable and check.discriminates and (check.hackable or not check.sql_ok):
            target = "verifier"  # only a verifier is at fault
        feedback = prompts.format_summary(summary) + f"\n\nWhat happened: {check.reason}"
        if target == "data":
            rows = await _gen_rows(ctx, dmeter, sh, task, feedback, extra)
            data_tries += rows.attempts
            data_errors += [f"attempt {attempt}: rows rejected: {'; '.join(e[:3])}" for e in rows.history if e]
            if rows.accepted:
                extra = rows.best.value  # re-check the same solution on the new rows next
                continue
            why = "; ".join(rows.last_errors[:3]) or "no usable rows"
            reasons.append(f"attempt {attempt}: data repair rejected: {why}")
            solution, sol_feedback = None, prompts.retry_message("solution", attempt, feedback)
        elif target == "verifier" and not check.calls_failed:
            vfix = await _gen_verifier(ctx, gmeter, sh, idx, task, feedback=feedback)
            if vfix.accepted:
                verifier = vfix.best.value
            solution, sol_feedback = None, None
        else:
            solution, sol_feedback = None, prompts.retry_message("solution", attempt, feedback)
    if data_tries:
        ctx.record(dmeter.report(stage="data_repair", scenario=sh.name, task_idx=idx, ok=False, attempts=data_tries,
                                 errors=data_errors or ["the rows did not make the task solvable"],
                                 details={"rows_added": 0}))
    ctx.record(gmeter.report(stage="gate", scenario=sh.name, task_idx=idx, ok=False, attempts=cfg.gate_attempts,
                             errors=reasons or ["gate budget spent"],
                             details={"solvable": check.solvable,
                                      "discriminates": check.discriminates if check.evaluated else None,
                                      "sql_usable": check.sql_ok if check.evaluated else None,
                                      "dropped": True}))
    return False


async def _gate_check(ctx: RunContext, sh: _Shared, idx: int, task: str, verifier: dict[str, Any],
                      solution: Solution, extra: list[dict[str, Any]] | None) -> GateCheck:
    """Check a task on the committed data (plus its own ``extra`` rows); accept it if it passes.

    Extra rows are committed only if every task accepted so far still passes on them.
    """
    async with sh.lock:
        runtime, rows = sh.runtime, 0
        if extra:
            runtime, rows, why = await _candidate(ctx, sh, extra)
            if runtime is None:
                return GateCheck(reason=why, data_rejected=True)
        check = await _check(ctx, runtime, _Accepted(verifier["code"], verifier["sql"], solution), task)
        if not check.ok:
            return check
        verifier = {**verifier, "code": check.guarded_code or verifier["code"]}
        if extra:
            broken = []
            for i, done in sorted(sh.accepted.items()):
                again = await _check(ctx, runtime, done)
                if not again.ok:
                    broken.append(f"task {i} ({sh.tasks[i][:80]!r}): {again.reason}")
            if broken:
                return GateCheck(reason="the added rows break accepted tasks: " + "; ".join(broken),
                                 data_rejected=True, evaluated=True, calls=check.calls)
            seq = max((int(p["seq"]) for p in patches(ctx, sh.name)), default=-1) + 1
            commit = {"scenario": sh.name, "seq": seq, "task_idx": idx, "task": task, "rows": rows,
                      "rechecked": sorted(sh.accepted), "tables": extra}
            patch_store(ctx).append_once(commit)  # the commit point (see synth.stages.sample)
            sh.sample, sh.runtime = effective_sample(ctx, sh.name), runtime
            check.data_commit = commit
        sh.accepted[idx] = _Accepted(verifier["code"], verifier["sql"], solution)
        _write_verifiers(ctx, sh.name, idx, task, verifier)
        ctx.stores.solution.append_once(solution.record(sh.name, idx))
        return check


async def _candidate(ctx: RunContext, sh: _Shared,
                     extra: list[dict[str, Any]]) -> tuple[EnvRuntime | None, int, str]:
    """The env on the committed data plus ``extra``: ``(runtime, rows added, "")`` or ``(None, 0, why)``."""
    run = await asyncio.to_thread(run_extra_inserts, sh.initial, extra)
    if run.errors:
        return None, 0, "the added rows do not insert on the current data: " + "; ".join(run.errors[:5])
    tables = merge_tables(sh.sample["sample_data"]["tables"], extra)
    sample = {"sample_data": {"tables": tables}}
    bundle = make_bundle(sh.name, db=sh.db, sample=sample, spec=sh.spec, code=sh.code, tasks=sh.tasks)
    runtime, err = await asyncio.to_thread(load_runtime, bundle, ctx.config.tool_timeout_s)
    if runtime is None:
        return None, 0, f"with the added rows, {err}"
    expected = sh.runtime.template.rows + run.rows
    if runtime.template.errors or runtime.template.rows != expected:
        return None, 0, (f"the farm's build of the new data differs ({runtime.template.rows} rows, expected "
                         f"{expected}): " + "; ".join(runtime.template.errors[:5]))
    return runtime, run.rows, ""


async def _gen_rows(ctx: RunContext, meter: Meter, sh: _Shared, task: str, failure: str,
                    extra: list[dict[str, Any]] | None) -> LoopResult:
    """Ask for the INSERTs a task lacks; accepted when they all run on the committed data."""

    async def evaluate(text: str) -> Attempt:
        try:
            tables = [t.model_dump() for t in parse_answer(text, RowsAnswer).tables]
        except ParseError as exc:
            return Attempt(ok=False, errors=[str(exc)])
        pending = merge_tables(extra or [], tables)
        run = await asyncio.to_thread(run_extra_inserts, sh.initial, pending)
        return Attempt(ok=not run.errors, value=pending, errors=run.errors, score=-len(run.errors),
                       excerpt="\n".join(s for t in tables for s in t["insert_statements"]) or text,
                       details={"rows": run.rows})

    messages = prompts.data_repair_messages(sh.name, task, sh.ddl, sh.excerpt(extra), failure)
    return await self_correct(ctx, meter, stage="gate.data", scenario=sh.name, messages=messages,
                              evaluate=evaluate, executable=True, max_attempts=DATA_ATTEMPTS)


async def _gen_verifier(ctx: RunContext, meter: Meter, sh: _Shared, idx: int, task: str,
                        feedback: str | None) -> LoopResult:
    sandbox = ctx.get_sandbox()

    async def evaluate(text: str) -> Attempt:
        try:
            data = parse_answer(text, VerifierAnswer)
        except ParseError as exc:
            return Attempt(ok=False, errors=[str(exc)])
        sql_code, code_code = data.sql_verifier, data.code_verifier
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
        criteria = data.model_dump(include={"reasoning", "success_criteria", "failure_criteria"})
        return Attempt(ok=not errors, value={"sql": sql_code, "code": code_code, "criteria": criteria},
                       errors=errors, score=-len(errors), excerpt=f"{sql_code}\n\n{code_code}")

    messages = prompts.verifier_messages(sh.name, task, sh.ddl, sh.excerpt(), sh.tools)
    if feedback:
        messages = [*messages, {"role": "user", "content": "A previous verifier for this task judged a reference "
                                "run wrongly. Write corrected verifiers.\n" + feedback}]
    return await self_correct(ctx, meter, stage="verifier", scenario=sh.name, messages=messages,
                              evaluate=evaluate, executable=True)


async def _check(ctx: RunContext, runtime: EnvRuntime, task: _Accepted, text: str | None = None) -> GateCheck:
    """The conformance checker's verdict on one (verifiers, reference solution) set; with the
    task's ``text``, the hack probes' on its code-mode verifier too."""
    tc = await check_solution(runtime, task.code, task.solution.calls, ctx.get_sandbox(), sql_verifier=task.sql,
                              final_answer=task.solution.final_answer)
    check = GateCheck(
        solvable=tc.solution_result == "complete",
        discriminates=tc.evaluated and tc.noop_result is not None and tc.noop_result != "complete",
        evaluated=tc.evaluated, calls_failed=tc.calls_failed, sql_ok=tc.sql_usable is not False,
        reason="; ".join(tc.problems), calls=tc.calls,
    )
    if text is not None and check.solvable and check.discriminates:
        touched = await touched_by(runtime, task.solution.calls)
        code = guard_code(task.code, touched or {}, sorted(await read_written_tables(runtime)))
        report = await probe_task(runtime, ProbeTask(text=text, code_verifier=code, solution=task.solution.calls,
                                                     final_answer=task.solution.final_answer),
                                  Judge(JudgeConfig(use_llm="never"), sandbox=ctx.get_sandbox()))
        if report.rejects:
            check.hackable = True
            check.reason = f"the verifier rewards a hack: {report.summary()}"
        check.guarded_code = code
    return check


def _parse_solution(text: str) -> Solution:
    answer = parse_answer(text, SolutionAnswer)
    return Solution([ToolCall(tool=c.tool, arguments=c.arguments) for c in answer.solution], answer.final_answer)


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
