"""The conformance checker for environments: one implementation for `envfarm envs check` and
for synth's acceptance gate.

For one env it loads the code, builds the DB, lists the tools, optionally probes every tool with
schema-valid example arguments, and for every task with a reference solution runs that solution
on a fresh instance and the code-mode verifier (in the judge's sandbox, never in this process)
on before/after; a task is *solvable* when the solution passes and a no-op does not.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from envfarm.errors import EnvLoadError
from envfarm.models import EnvBundle, ToolCall, ToolSpec
from envfarm.runtime import EnvRuntime, Instance


class TaskCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_idx: int
    solvable: bool = Field(description="Reference solution passes and a no-op does not.")
    solution_result: str | None = Field(None, description="Verifier 'result' after the solution.")
    noop_result: str | None = Field(None, description="Verifier 'result' after a no-op.")
    problems: list[str] = Field(default_factory=list)


class EnvReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    loaded: bool
    tables: int = 0
    rows: int = 0
    tools: int = 0
    tasks: int = 0
    solvable: int = Field(0, description="Tasks whose reference solution passes, no-op fails.")
    build_ms: float = 0.0
    problems: list[str] = Field(default_factory=list)
    task_checks: list[TaskCheck] = Field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The flat JSON object `envfarm envs check --json` prints."""
        return self.model_dump(exclude={"task_checks"})


async def check_env(bundle: EnvBundle, sandbox: Any = None, *, probe: bool = False,
                    runtime: EnvRuntime | None = None) -> EnvReport:
    """Check one env. ``sandbox`` is a ``judge.VerifierSandbox`` (made here when omitted)."""
    report = EnvReport(name=bundle.name, loaded=False, tasks=len(bundle.tasks),
                       problems=list(bundle.problems))
    try:
        runtime = runtime or EnvRuntime(bundle)
    except EnvLoadError as exc:
        report.problems.append(exc.message)
        return report
    report.loaded = True
    report.tables, report.rows = runtime.template.tables, runtime.template.rows
    report.tools = len(runtime.tools)
    report.build_ms = runtime.build_seconds * 1000
    report.problems += [p for p in runtime.problems if p not in report.problems]
    if probe:
        report.problems += await probe_tools(runtime)
    if bundle.solutions:
        own = sandbox is None
        if own:
            from judge import VerifierSandbox

            sandbox = VerifierSandbox()
        try:
            for idx in sorted(bundle.solutions):
                report.task_checks.append(await check_task(runtime, idx, sandbox))
        finally:
            if own:
                sandbox.close()
    report.solvable = sum(t.solvable for t in report.task_checks)
    for t in report.task_checks:
        report.problems += [f"task {t.task_idx}: {p}" for p in t.problems]
    return report


async def check_task(runtime: EnvRuntime, idx: int, sandbox: Any) -> TaskCheck:
    bundle = runtime.bundle
    check = TaskCheck(task_idx=idx, solvable=False)
    verifier = bundle.code_verifiers.get(idx)
    if verifier is None:
        check.problems.append("no code-mode verifier")
        return check
    inst = runtime.instance()
    try:
        failures = await run_solution(inst, bundle.solutions.get(idx, []))
        check.problems += failures
        final = inst.snapshot()
    finally:
        inst.close()
    initial = runtime.template.data
    after = await sandbox.run(verifier.code, initial, final)
    noop = await sandbox.run(verifier.code, initial, initial)
    for label, res in (("after the reference solution", after), ("after a no-op", noop)):
        if not res.ok:
            check.problems.append(f"verifier failed {label}: {res.error}")
    check.solution_result = _result(after)
    check.noop_result = _result(noop)
    if after.ok and check.solution_result != "complete":
        check.problems.append(f"reference solution does not pass (verifier says "
                              f"{check.solution_result!r})")
    if noop.ok and check.noop_result == "complete":
        check.problems.append("a no-op episode passes the verifier")
    check.solvable = (not failures and check.solution_result == "complete"
                      and noop.ok and check.noop_result != "complete")
    return check


async def run_solution(inst: Instance, calls: list[ToolCall]) -> list[str]:
    """Apply tool calls in order; returns a problem per failed call."""
    problems = []
    for step, call in enumerate(calls):
        res = await inst.call(call.tool, call.arguments)
        if not res.ok:
            problems.append(f"solution step {step} ({call.tool}) failed: {res.error.message}")
    return problems


async def probe_tools(runtime: EnvRuntime) -> list[str]:
    """Call every tool once with example arguments on a fresh instance; env errors are problems."""
    problems = []
    for tool in runtime.tools:
        inst = runtime.instance()
        try:
            res = await inst.call(tool.name, example_arguments(tool))
        finally:
            inst.close()
        if not res.ok and res.error.kind == "env_error":
            problems.append(f"tool {tool.name} fails on example arguments: {res.error.message}")
    return problems


def example_arguments(tool: ToolSpec) -> dict[str, Any]:
    """Schema-valid arguments for the required parameters (examples and defaults first)."""
    schema = tool.input_schema
    props = schema.get("properties", {})
    return {name: _example(props.get(name, {}), schema.get("$defs", {}))
            for name in schema.get("required", [])}


def _example(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    if "$ref" in schema:
        schema = defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
    for key in ("example", "default"):
        if key in schema:
            return schema[key]
    if schema.get("examples"):
        return schema["examples"][0]
    if schema.get("enum"):
        return schema["enum"][0]
    for option in schema.get("anyOf", []) + schema.get("oneOf", []):
        if option.get("type") != "null":
            return _example(option, defs)
    kind = schema.get("type", "string")
    if kind == "object":
        return {k: _example(v, defs) for k, v in schema.get("properties", {}).items()
                if k in schema.get("required", [])}
    return {"integer": 1, "number": 1.0, "boolean": True, "array": [],
            "null": None}.get(kind, _string_example(schema))


def _string_example(schema: dict[str, Any]) -> str:
    fmt = schema.get("format")
    if fmt == "date-time":
        return "2025-01-01T00:00:00"
    if fmt == "date":
        return "2025-01-01"
    if fmt == "email":
        return "user@example.com"
    return "example"


def _result(res: Any) -> str | None:
    if not res.ok or not isinstance(res.result, dict):
        return None
    value = res.result.get("result")
    return value if isinstance(value, str) else None


def check_env_sync(bundle: EnvBundle, sandbox: Any = None, *, probe: bool = False) -> EnvReport:
    return asyncio.run(check_env(bundle, sandbox, probe=probe))
