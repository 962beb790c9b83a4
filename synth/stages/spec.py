"""Stage 5: the toolset spec (operation ids, typed params, response schemas) covering every task."""

from __future__ import annotations

import re
from typing import Any

from synth import prompts
from synth._context import Meter, RunContext
from synth._correct import Attempt, self_correct
from synth._answers import SpecAnswer, validate_answer
from synth._parse import ParseError, extract_json
from synth._sql import ddl_text

_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
_PARAM_TYPES = {"path", "query", "body"}
_TYPES = {"string", "integer", "number", "float", "boolean", "array", "object"}
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


def validate_spec(spec: dict[str, Any], n_tasks: int, tables: set[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Problems of an AWM api_spec plus its task coverage; ``([], coverage)`` when it is good."""
    errors: list[str] = []
    groups = spec.get("api_groups")
    if not isinstance(groups, list) or not groups:
        return ['"api_groups" must be a non-empty list'], {}
    ops: set[str] = set()
    for g in groups:
        for ep in g.get("endpoints", []) if isinstance(g, dict) else []:
            op = ep.get("operation_id")
            where = f"endpoint {op or ep.get('path')!r}"
            if not isinstance(op, str) or not _IDENT.match(op):
                errors.append(f"{where}: operation_id must be snake_case")
            elif op in ops:
                errors.append(f"{where}: duplicate operation_id")
            ops.add(op if isinstance(op, str) else "")
            path = ep.get("path")
            if not isinstance(path, str) or not path.startswith("/"):
                errors.append(f"{where}: path must start with '/'")
                path = ""
            if str(ep.get("method", "")).upper() not in _METHODS:
                errors.append(f"{where}: method must be one of {sorted(_METHODS)}")
            params = ep.get("request_params", {}) or {}
            if not isinstance(params, dict):
                errors.append(f"{where}: request_params must be an object")
                params = {}
            for pname, p in params.items():
                if not isinstance(p, dict):
                    errors.append(f"{where}: param {pname!r} must be an object")
                    continue
                if p.get("param_type") not in _PARAM_TYPES:
                    errors.append(f"{where}: param {pname!r} needs param_type path|query|body")
                if str(p.get("type", "")).lower() not in _TYPES:
                    errors.append(f"{where}: param {pname!r} has unknown type {p.get('type')!r}")
                if p.get("param_type") == "path" and "{" + pname + "}" not in path:
                    errors.append(f"{where}: path param {pname!r} is not in the path {path!r}")
            for name in re.findall(r"{(\w+)}", path):
                if name not in params:
                    errors.append(f"{where}: path placeholder {{{name}}} has no request param")
            if not isinstance(ep.get("response"), dict):
                errors.append(f"{where}: response schema must be an object")
            required_tables = ep.get("required_tables") or []
            for t in required_tables if isinstance(required_tables, list) else []:
                if isinstance(t, str) and t.lower() not in tables:
                    errors.append(f"{where}: required table {t!r} is not in the schema")
    if not ops:
        errors.append("the spec has no endpoints")
    raw_cov = spec.get("task_coverage")
    coverage: dict[str, list[str]] = {}
    if not isinstance(raw_cov, dict):
        errors.append('"task_coverage" must map every task index to the operation ids that solve it')
    else:
        for i in range(n_tasks):
            used = raw_cov.get(str(i), raw_cov.get(i)) or []
            used = [u for u in used if isinstance(u, str)] if isinstance(used, list) else []
            missing = [u for u in used if u not in ops]
            if not used:
                errors.append(f"task {i} is not covered by any endpoint")
            if missing:
                errors.append(f"task {i} uses undefined operation ids {missing}")
            coverage[str(i)] = used
    return errors, coverage


async def run_spec(ctx: RunContext, scenario: dict[str, Any]) -> bool:
    name = scenario["name"]
    tasks = ctx.stores.task.get(name)["tasks"]
    db_tables = ctx.stores.db.get(name)["db_schema"]["tables"]
    table_names = {t["name"].lower() for t in db_tables}
    meter = Meter()

    async def evaluate(text: str) -> Attempt:
        try:
            spec = extract_json(text)
            validate_answer(spec, SpecAnswer)  # the structure validate_spec walks
        except ParseError as exc:
            return Attempt(ok=False, errors=[str(exc)])
        errors, coverage = validate_spec(spec, len(tasks), table_names)
        value = {"api_groups": spec.get("api_groups")}
        n_ops = sum(len(g.get("endpoints", [])) for g in value["api_groups"] or [] if isinstance(g, dict))
        return Attempt(ok=not errors, value=value, errors=errors, score=-len(errors),
                       details={"endpoints": n_ops, "task_coverage": coverage})

    loop = await self_correct(ctx, meter, stage="spec", scenario=name,
                              messages=prompts.spec_messages(name, tasks, ddl_text(db_tables)),
                              evaluate=evaluate, executable=False)
    best = loop.best
    if loop.accepted:
        ctx.stores.spec.append_once({"scenario": name, "api_spec": best.value})
    ctx.record(meter.report(stage="spec", scenario=name, ok=loop.accepted, attempts=loop.attempts,
                            errors=best.errors if best else [], details=best.details if best else {}))
    return loop.accepted
