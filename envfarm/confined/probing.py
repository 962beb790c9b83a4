"""Calling a loaded env with no agent: schema-valid example arguments for its tools, and the
probe of its module's state (run in the env worker at load, so it lives on the confined side;
the conformance checker and the hack probes use the same arguments).
"""

from __future__ import annotations

import collections
import json
import types
from typing import Any

import jsonschema

from envfarm.confined.runtime import EnvRuntime
from envfarm.models import ToolSpec


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
