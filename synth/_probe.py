"""Loading generated env code in envfarm's runtime and probing every tool with example arguments."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from envfarm import EnvBundle, EnvRuntime
from envfarm.errors import EnvfarmError
from envfarm.models import DBSchema, SampleData, ToolSpec


def make_bundle(name: str, *, db: dict[str, Any] | None, sample: dict[str, Any] | None,
                spec: dict[str, Any] | None, code: str | None, tasks: list[str] | None = None,
                description: str = "") -> EnvBundle:
    """An :class:`envfarm.EnvBundle` from this run's stage records."""
    return EnvBundle(
        name=name, description=description, tasks=tasks or [],
        db_schema=DBSchema.model_validate(db["db_schema"]) if db else None,
        sample_data=SampleData.model_validate(sample["sample_data"]) if sample else None,
        api_spec=spec["api_spec"] if spec else None, code=code,
    )


def load_runtime(bundle: EnvBundle, timeout_s: float) -> tuple[EnvRuntime | None, str | None]:
    """``(runtime, None)`` or ``(None, why it does not load)``; never raises for bad env code."""
    try:
        return EnvRuntime(bundle, call_timeout_s=timeout_s), None
    except EnvfarmError as exc:
        return None, f"env does not load: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - generated code may fail in any way while loading
        return None, f"env does not load: {type(exc).__name__}: {exc}"


def spec_endpoints(api_spec: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """operation_id -> endpoint of an AWM api_spec."""
    out: dict[str, dict[str, Any]] = {}
    for g in (api_spec or {}).get("api_groups", []):
        for ep in g.get("endpoints", []):
            if isinstance(ep.get("operation_id"), str):
                out[ep["operation_id"]] = ep
    return out


def example_args(tool: ToolSpec, endpoint: dict[str, Any] | None) -> dict[str, Any]:
    """Schema-valid arguments: the spec's examples where they fit, schema defaults otherwise."""
    schema = tool.input_schema
    props: dict[str, Any] = schema.get("properties", {})
    args: dict[str, Any] = {}
    for name, p in ((endpoint or {}).get("request_params") or {}).items():
        if name in props and isinstance(p, dict) and "example" in p:
            args[name] = p["example"]
    for name in schema.get("required", []):
        if name not in args and name in props:
            args[name] = _value_for(props[name], schema)
    try:
        validator = jsonschema.Draft202012Validator(schema)
        for err in list(validator.iter_errors(args)):
            key = err.path[0] if err.path else None
            if isinstance(key, str) and key in props:
                args[key] = _value_for(props[key], schema)
    except jsonschema.exceptions.SchemaError:
        pass
    return args


def _value_for(prop: dict[str, Any], root: dict[str, Any]) -> Any:
    if "$ref" in prop:
        target = prop["$ref"].rsplit("/", 1)[-1]
        prop = root.get("$defs", {}).get(target, {})
    if "default" in prop and prop["default"] is not None:
        return prop["default"]
    if "enum" in prop:
        return prop["enum"][0]
    for alt in prop.get("anyOf", []) + prop.get("oneOf", []):
        if alt.get("type") != "null":
            return _value_for(alt, root)
    kind = prop.get("type")
    fmt = prop.get("format")
    if kind == "string":
        return {"date-time": "2025-01-01T00:00:00", "date": "2025-01-01", "email": "user@example.com"}.get(fmt, "example")
    return {"integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}.get(kind, "example")


@dataclass
class ProbeReport:
    """What probing an env found."""

    tools: int = 0
    errors: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)


async def probe(runtime: EnvRuntime, api_spec: dict[str, Any] | None) -> ProbeReport:
    """Every spec operation must be a tool; every tool must answer example arguments without a 5xx."""
    endpoints = spec_endpoints(api_spec)
    tools = {t.name: t for t in runtime.tools}
    report = ProbeReport(tools=len(tools))
    if not tools:
        report.errors.append("the app exposes no tools (no routes with operation_id)")
    missing = sorted(set(endpoints) - set(tools))
    if missing:
        report.errors.append(f"spec operations with no route (operation_id): {missing}")
    inst = runtime.instance()
    try:
        for name, tool in tools.items():
            args = example_args(tool, endpoints.get(name))
            inst.reset()
            res = await inst.call(name, args)
            report.calls.append({"tool": name, "arguments": args, "ok": res.ok, "status": res.status})
            if not res.ok and res.error is not None and res.error.kind == "env_error":
                report.errors.append(f"tool {name} with example arguments {args} -> server error: {res.error.message}")
            await asyncio.sleep(0)  # let other scenarios' work interleave
    finally:
        inst.close()
    return report
