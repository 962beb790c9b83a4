"""The conformance checker for environments: one implementation for `envfarm envs check` and
for synth's acceptance gate.

For one env it loads the code, builds the DB, lists the tools, optionally probes every tool with
schema-valid example arguments, and for every task with a reference solution runs that solution
on a fresh instance and the code-mode verifier (in the judge's sandbox, never in this process)
on before/after; a task is *solvable* when the solution passes and a no-op does not.
"""

from __future__ import annotations

import asyncio
import collections
import json
import types
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict, Field

from envfarm.errors import EnvLoadError
from envfarm.models import EnvBundle, ToolCall, ToolSpec
from envfarm.runtime import EnvRuntime
from envfarm.verdict import Outcome, code_result_outcome


class TaskCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_idx: int
    solvable: bool = Field(description="Reference solution passes and a no-op does not.")
    solution_result: str | None = Field(None, description="Verifier 'result' after the solution.")
    noop_result: str | None = Field(None, description="Verifier 'result' after a no-op.")
    final_answer: str | None = Field(None, description="The reference solution's final answer, "
                                     "given to the verifier after the solution (never after a no-op).")
    sql_usable: bool | None = Field(None, description="The sql-mode verifier returned facts the judge "
                                    "can use after the solution; None when the task has none.")
    calls_failed: bool = Field(False, description="A call of the reference solution failed.")
    evaluated: bool = Field(False, description="The verifier got to judge both episodes.")
    calls: list[dict[str, Any]] = Field(default_factory=list, description="Each call and outcome.")
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
    defects: list[str] = Field(default_factory=list,
                               description="Tools that failed every schema-valid probe (4xx each time).")
    module_state: list[str] = Field(default_factory=list, description=(
        "Module globals that tool calls change (with --probe): leases would see each other "
        "through them, so the farm gives such an env a worker per lease."))
    probed: int = Field(0, description="Tasks the hack probes ran on (with --hacks).")
    hackable: dict[int, str] = Field(default_factory=dict, description=(
        "Tasks a hack probe passes (or whose verifier cannot judge one), with which (with "
        "--hacks; envfarm.hackprobes): a farm quarantines them once flagged."))
    task_checks: list[TaskCheck] = Field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The flat JSON object `envfarm envs check --json` prints."""
        return self.model_dump(exclude={"task_checks"})


async def check_env(bundle: EnvBundle, sandbox: Any, *, probe: bool = False,
                    runtime: EnvRuntime | None = None) -> EnvReport:
    """Check one env. ``sandbox`` runs the verifiers (the caller's ``judge.VerifierSandbox``)."""
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
        report.module_state = await module_state_leaks(runtime)  # before any other call
        probed = await probe_tools(runtime)
        report.problems += probed.errors
        report.defects = probed.defects
    for idx in sorted(bundle.solutions):
        report.task_checks.append(await check_task(runtime, idx, sandbox))
    report.solvable = sum(t.solvable for t in report.task_checks)
    for t in report.task_checks:
        report.problems += [f"task {t.task_idx}: {p}" for p in t.problems]
    return report


async def check_task(runtime: EnvRuntime, idx: int, sandbox: Any) -> TaskCheck:
    """Check one task of the runtime's bundle with its reference solution."""
    verifier = runtime.bundle.code_verifiers.get(idx)
    if verifier is None:
        return TaskCheck(task_idx=idx, solvable=False, problems=["no code-mode verifier"])
    sql = runtime.bundle.verifiers.get(idx)
    return await check_solution(runtime, verifier.code, runtime.bundle.solutions.get(idx, []),
                                sandbox, task_idx=idx, sql_verifier=sql.code if sql else None,
                                final_answer=runtime.bundle.solution_answers.get(idx))


async def check_solution(runtime: EnvRuntime, verifier_code: str, calls: list[ToolCall],
                         sandbox: Any, *, task_idx: int = -1, sql_verifier: str | None = None,
                         final_answer: str | None = None, initial: bytes | None = None) -> TaskCheck:
    """Run ``calls`` on a fresh instance (stopping at the first failure), then the code-mode
    verifier on (initial, final) with the solution's ``final_answer`` and on a no-op (initial,
    initial) with none. An sql-mode verifier, when given, must return facts the judge can use.
    ``initial``: the task's own starting database (default: the task's state in the bundle,
    else the template)."""
    check = TaskCheck(task_idx=task_idx, solvable=False, final_answer=final_answer)
    if not calls:
        check.calls_failed = True
        check.problems.append("the reference solution has no tool calls")
        return check
    initial = initial if initial is not None else runtime.task_initial(task_idx if task_idx >= 0 else None)
    inst = runtime.instance(initial)
    try:
        for step, call in enumerate(calls):
            res = await inst.call(call.tool, call.arguments)
            check.calls.append({"tool": call.tool, "arguments": call.arguments, "ok": res.ok,
                                "result": res.result if res.ok else res.error.model_dump()})
            if not res.ok:
                check.calls_failed = True
                check.problems.append(f"solution step {step} {call.tool}"
                                      f"({json.dumps(call.arguments, default=str)}) failed: "
                                      f"{res.error.message}")
                return check
        final = inst.snapshot()
    finally:
        inst.close()
    runs = [sandbox.run(verifier_code, initial, final, final_answer, mode="code"),
            sandbox.run(verifier_code, initial, initial, mode="code")]
    if sql_verifier is not None:
        runs += [sandbox.run(sql_verifier, initial, final, mode="sql"),
                 sandbox.run(sql_verifier, initial, initial, mode="sql")]
    after, noop, *sql = await asyncio.gather(*runs)
    check.evaluated = True
    check.solution_result, check.noop_result = _result(after), _result(noop)
    if not after.ok:
        check.problems.append(f"verifier failed after the reference solution: {after.error}")
    elif not _complete(check.solution_result):
        check.problems.append(f"verifier says {after.result!r} after the reference solution ran "
                              "without errors")
    if not noop.ok:
        check.problems.append(f"verifier failed on a no-op episode: {noop.error}")
    elif _complete(check.noop_result):
        check.problems.append(f"verifier says {noop.result!r} for a no-op episode")
    if sql:
        why = sql_problem(sql[0], sql[1], changed=final != initial)
        check.sql_usable = why is None
        if why:
            check.problems.append(why)
    check.solvable = (_complete(check.solution_result) and noop.ok
                      and not _complete(check.noop_result) and check.sql_usable is not False)
    return check


def sql_problem(after: Any, noop: Any, *, changed: bool) -> str | None:
    """Why an sql-mode verifier's output is of no use to the LLM judge, or None.

    The judge reads the facts it returns: they must exist after the reference solution and, when
    the solution changed the database, differ from what a no-op episode gives.
    """
    if not after.ok:
        return f"sql-mode verifier failed after the reference solution: {after.error}"
    if not after.result:
        return "sql-mode verifier returned an empty object after the reference solution"
    if not noop.ok:
        return f"sql-mode verifier failed on a no-op episode: {noop.error}"
    if changed and after.result == noop.result:
        return ("sql-mode verifier returns the same facts after the reference solution as after a "
                "no-op, so the judge cannot tell them apart")
    return None


class ProbeReport(BaseModel):
    """What probing every tool of an env found."""

    model_config = ConfigDict(extra="forbid")

    tools: int = 0
    errors: list[str] = Field(default_factory=list,
                              description="No tools, spec operations without a route, 5xx answers.")
    defects: list[str] = Field(default_factory=list,
                               description="Tools that failed every schema-valid probe (4xx each time).")
    defective_tools: list[str] = Field(default_factory=list, description="The names of those tools.")
    calls: list[dict[str, Any]] = Field(default_factory=list, description="Each probe and outcome.")


async def probe_tools(runtime: EnvRuntime, *, probes_per_tool: int = 6) -> ProbeReport:
    """Call every tool with up to ``probes_per_tool`` schema-valid argument sets, each on a fresh
    instance. A server error is an error; a tool that fails every probe is a defect (an agent
    could never use it)."""
    endpoints = spec_endpoints(runtime.bundle.api_spec)
    report = ProbeReport(tools=len(runtime.tools))
    if not runtime.tools:
        report.errors.append("the app exposes no tools (no routes with operation_id)")
    missing = sorted(set(endpoints) - {t.name for t in runtime.tools})
    if missing:
        report.errors.append(f"spec operations with no route (operation_id): {missing}")
    inst = runtime.instance()
    try:
        for tool in runtime.tools:
            failures = []
            for args in probe_arguments(tool, endpoints.get(tool.name), probes_per_tool):
                inst.reset()
                res = await inst.call(tool.name, args)
                report.calls.append({"tool": tool.name, "arguments": args, "ok": res.ok,
                                     "status": res.status})
                if res.ok:
                    break
                if res.error.kind == "env_error":
                    report.errors.append(f"tool {tool.name} with example arguments {args} -> "
                                         f"server error: {res.error.message}")
                    break
                failures.append(f"{json.dumps(args, default=str)} -> {res.error.message}")
                await asyncio.sleep(0)  # let other work on this loop interleave
            else:
                if failures:
                    report.defective_tools.append(tool.name)
                    report.defects.append(f"tool {tool.name} failed every schema-valid probe "
                                          f"({len(failures)}): " + "; ".join(failures)[:600])
    finally:
        inst.close()
    return report


def spec_endpoints(api_spec: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """operation_id -> endpoint of an AWM api_spec."""
    out: dict[str, dict[str, Any]] = {}
    for group in (api_spec or {}).get("api_groups", []):
        for ep in group.get("endpoints", []):
            if isinstance(ep, dict) and isinstance(ep.get("operation_id"), str):
                out[ep["operation_id"]] = ep
    return out


def example_arguments(tool: ToolSpec, endpoint: dict[str, Any] | None = None) -> dict[str, Any]:
    """Schema-valid arguments: the AWM spec's examples where they fit, then the schema's own
    examples/defaults, then type-based placeholders, for the required parameters."""
    schema = tool.input_schema
    props: dict[str, Any] = schema.get("properties", {})
    args: dict[str, Any] = {}
    for name, param in ((endpoint or {}).get("request_params") or {}).items():
        if name in props and isinstance(param, dict) and "example" in param:
            args[name] = param["example"]
    for name in schema.get("required", []):
        if name not in args and name in props:
            args[name] = _example(props[name], schema.get("$defs", {}))
    try:  # replace spec examples that do not fit the real schema
        for err in list(jsonschema.Draft202012Validator(schema).iter_errors(args)):
            key = err.path[0] if err.path else None
            if isinstance(key, str) and key in props:
                args[key] = _example(props[key], schema.get("$defs", {}))
    except jsonschema.exceptions.SchemaError:
        pass
    return args


def probe_arguments(tool: ToolSpec, endpoint: dict[str, Any] | None = None,
                    limit: int = 6) -> list[dict[str, Any]]:
    """Up to ``limit`` distinct schema-valid argument sets: :func:`example_arguments`, the same
    with required parameters only, the schema's own placeholders, then each with other ids
    (integer ``*id`` arguments set to 2, 3, ...: the first row may be in a state the tool refuses)."""
    full = example_arguments(tool, endpoint)
    required = set(tool.input_schema.get("required", []))
    bases = [full, {k: v for k, v in full.items() if k in required}, example_arguments(tool)]
    ids = [k for k in full if k.lower().endswith("id") and type(full[k]) is int]
    variants = [*bases, *({**b, **{k: n for k in ids if k in b}} for n in (2, 3, 4, 5) for b in bases)]
    try:
        validator = jsonschema.Draft202012Validator(tool.input_schema)
        valid = [v for v in variants if validator.is_valid(v)]
    except jsonschema.exceptions.SchemaError:
        valid = []
    out: dict[str, dict[str, Any]] = {}
    for args in valid or [full]:
        out.setdefault(json.dumps(args, sort_keys=True, default=str), args)
    return list(out.values())[:limit]


def _example(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    if "$ref" in schema:
        schema = defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
    for key in ("example", "default"):
        if schema.get(key) is not None:
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
    return {"date-time": "2025-01-01T00:00:00", "date": "2025-01-01",
            "email": "user@example.com"}.get(schema.get("format"), "example")


def _complete(result: str | None) -> bool:
    # The judge's rule, so "solvable" here means "scores 1.0" there.
    return code_result_outcome(result) is Outcome.completed


def _result(res: Any) -> str | None:
    if not res.ok or not isinstance(res.result, dict):
        return None
    value = res.result.get("result")
    return value if isinstance(value, str) else None


def check_env_sync(bundle: EnvBundle, sandbox: Any, *, probe: bool = False) -> EnvReport:
    return asyncio.run(check_env(bundle, sandbox, probe=probe))


# -- module-level state (leases that share a loaded module must not see each other) ----------
_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_CONTAINERS = (dict, list, set, frozenset, tuple, bytearray, collections.deque)


def module_state(module: types.ModuleType, limit: int = 20_000) -> dict[str, str]:
    """A fingerprint of the state a loaded env module keeps outside any database: its plain
    globals (scalars, containers), instances of its own classes, and its classes' own plain
    attributes. Engines, sessions, the app and imported modules are not state of a lease."""
    own = module.__name__
    out: dict[str, str] = {}
    for name, value in list(vars(module).items()):
        if name.startswith("__"):
            continue
        if isinstance(value, type) and value.__module__ == own:
            attrs = {k: v for k, v in vars(value).items()
                     if not k.startswith("__") and _is_state(v, own)}
            if attrs:
                out[f"{name}.<class attrs>"] = _fingerprint(attrs, own, limit)
        elif _is_state(value, own):
            out[name] = _fingerprint(value, own, limit)
    return out


def _is_state(value: Any, own: str) -> bool:
    return (isinstance(value, _SCALARS + _CONTAINERS)
            or type(value).__module__ == own and hasattr(value, "__dict__"))


def _fingerprint(value: Any, own: str, limit: int, depth: int = 0) -> str:
    if depth > 6:
        return "..."
    if isinstance(value, _SCALARS):
        return repr(value)[:200]
    if isinstance(value, dict):
        items = sorted((repr(k)[:100], _fingerprint(v, own, limit, depth + 1))
                       for k, v in list(value.items())[:500])
        text = "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    elif isinstance(value, (set, frozenset)):
        text = "{" + ",".join(sorted(_fingerprint(v, own, limit, depth + 1)
                                     for v in list(value)[:500])) + "}"
    elif isinstance(value, (list, tuple, bytearray, collections.deque)):
        text = "[" + ",".join(_fingerprint(v, own, limit, depth + 1)
                              for v in list(value)[:500]) + f"]#{len(value)}"
    elif type(value).__module__ == own and hasattr(value, "__dict__"):
        text = type(value).__name__ + _fingerprint(dict(vars(value)), own, limit, depth + 1)
    else:
        text = f"<{type(value).__name__}>"  # an engine, a session, a lock: not lease state
    return text[:limit]


async def module_state_leaks(runtime: EnvRuntime, *, probes_per_tool: int = 2) -> list[str]:
    """The globals of ``runtime``'s module that tool calls change: a differential run, where
    a lease (one instance) calls every tool with schema-valid arguments and the module's state
    afterwards is compared with the freshly loaded module's. A changed global is what a later
    lease would see of an earlier one, so such an env needs a module per lease."""
    before = module_state(runtime.module)
    inst = runtime.instance()
    endpoints = spec_endpoints(runtime.bundle.api_spec)
    try:
        for tool in runtime.tools:
            for args in probe_arguments(tool, endpoints.get(tool.name), probes_per_tool):
                await inst.call(tool.name, args)
    finally:
        inst.close()
    after = module_state(runtime.module)
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
