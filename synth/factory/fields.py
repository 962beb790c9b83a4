"""A tool's parameters and response fields: from its OpenAPI response model, else by running it.

Fields are flattened to dotted paths (``hotels[].id``: the ``id`` of each item of ``hotels``), the
form every other EnvFactory stage addresses a response by.
"""

from __future__ import annotations

import warnings
from typing import Any

from envfarm.confined.probing import probe_arguments, spec_endpoints
from envfarm.confined.runtime import EnvRuntime
from synth.factory.model import Field_, Node, Param

#: Deeper than this a response is nesting detail no chain binds to (and self-references stop here).
MAX_DEPTH = 4


def input_params(schema: dict[str, Any]) -> list[Param]:
    """The tool's input parameters, required ones flagged."""
    defs = schema.get("$defs", {})
    required = set(schema.get("required", []))
    return [Param(name=name, type=_type(_resolve(prop, defs)), required=name in required,
                  description=str(_resolve(prop, defs).get("description") or prop.get("description") or ""))
            for name, prop in schema.get("properties", {}).items()]


def schema_fields(schema: dict[str, Any] | None, components: dict[str, Any]) -> list[Field_]:
    """The leaf fields of a JSON-schema response model (``$ref`` into ``components``)."""
    out: dict[str, Field_] = {}
    if schema:
        _walk_schema(schema, "", components, out, 0)
    return list(out.values())


def value_fields(value: Any) -> list[Field_]:
    """The leaf fields of a JSON value a tool returned (list items merged)."""
    out: dict[str, Field_] = {}
    _walk_value(value, "", out, 0)
    return list(out.values())


def field_values(value: Any, path: str) -> list[Any]:
    """The values at a dotted field path in a tool's JSON answer, every list item's for ``[]``
    (``field_values({"hotels": [{"id": 1}, {"id": 2}]}, "hotels[].id") == [1, 2]``)."""
    current = [value]
    for part in path.split("."):
        key, lists = part.rstrip("[]"), (len(part) - len(part.rstrip("[]"))) // 2
        nxt = []
        for v in current:
            if key:
                if not isinstance(v, dict) or key not in v:
                    continue
                v = v[key]
            items = [v]
            for _ in range(lists):
                items = [i for it in items if isinstance(it, list) for i in it]
            nxt.extend(items)
        current = nxt
    return [v for v in current if v is not None]


def response_schemas(runtime: EnvRuntime) -> tuple[dict[str, dict[str, Any] | None], dict[str, Any]]:
    """tool -> its 2xx JSON response schema (None when the app declares none), and the components."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        openapi = runtime.app.openapi()
    components = openapi.get("components", {}).get("schemas", {})
    out: dict[str, dict[str, Any] | None] = {}
    for name, op in runtime.operations.items():
        spec = openapi.get("paths", {}).get(op.path, {}).get(op.method.lower(), {})
        schema = None
        for status, resp in sorted(spec.get("responses", {}).items()):
            if str(status).startswith("2"):
                schema = (resp.get("content", {}).get("application/json", {}) or {}).get("schema") or None
                break
        out[name] = schema
    return out, components


async def build_nodes(runtime: EnvRuntime) -> list[Node]:
    """One node per tool; fields from the response model, or from executing the tool on a fresh
    instance with schema-valid example arguments when the model says nothing."""
    schemas, components = response_schemas(runtime)
    endpoints = spec_endpoints(runtime.bundle.api_spec)
    nodes = []
    inst = runtime.instance()
    try:
        for tool in runtime.tools:
            node = Node(tool=tool.name, description=tool.description, params=input_params(tool.input_schema))
            node.fields = schema_fields(schemas.get(tool.name), components)
            if node.fields:
                node.fields_source = "schema"
            else:
                node.fields, node.note = await _probe_fields(inst, tool, endpoints.get(tool.name))
                node.fields_source = "probe" if node.fields else "none"
            nodes.append(node)
    finally:
        inst.close()
    return nodes


async def _probe_fields(inst: Any, tool: Any, endpoint: dict[str, Any] | None) -> tuple[list[Field_], str]:
    last = "no schema-valid example arguments"
    for args in probe_arguments(tool, endpoint, limit=4):
        inst.reset()  # every probe on the initial state
        res = await inst.call(tool.name, args)
        if not res.ok:
            last = res.error.message
            continue
        fields = value_fields(res.result)
        if fields:
            return fields, ""
        last = f"returned no JSON fields ({type(res.result).__name__})"
    inst.reset()
    return [], f"no response model; probe failed: {last}"[:300]


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Follow ``$ref`` and pick the non-null branch of ``anyOf``/``oneOf`` (Optional[X])."""
    for _ in range(8):
        if "$ref" in schema:
            schema = {**defs.get(schema["$ref"].rsplit("/", 1)[-1], {}),
                      **{k: v for k, v in schema.items() if k != "$ref"}}
            continue
        options = [o for o in schema.get("anyOf", []) + schema.get("oneOf", []) + schema.get("allOf", [])
                   if o.get("type") != "null"]
        if options and "type" not in schema and "properties" not in schema:
            schema = {**options[0], **{k: v for k, v in schema.items() if k not in ("anyOf", "oneOf", "allOf")}}
            continue
        break
    return schema


def _type(schema: dict[str, Any]) -> str:
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return str(kind)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _walk_schema(schema: dict[str, Any], path: str, defs: dict[str, Any], out: dict[str, Field_], depth: int) -> None:
    schema = _resolve(schema, defs)
    kind = _type(schema)
    if depth > MAX_DEPTH:
        return
    if kind == "object" or "properties" in schema:
        for key, sub in schema.get("properties", {}).items():
            _walk_schema(sub, _join(path, key), defs, out, depth + 1)
    elif kind == "array":
        _walk_schema(schema.get("items", {}), f"{path}[]", defs, out, depth + 1)
    elif path and path not in out:
        out[path] = Field_(path=path, type=kind, description=str(schema.get("description") or ""))


def _walk_value(value: Any, path: str, out: dict[str, Field_], depth: int) -> None:
    if depth > MAX_DEPTH:
        return
    if isinstance(value, dict):
        for key, sub in value.items():
            _walk_value(sub, _join(path, str(key)), out, depth + 1)
    elif isinstance(value, list):
        for item in value[:5]:  # a few items: optional keys missing from the first still show
            _walk_value(item, f"{path}[]", out, depth + 1)
    elif path and path not in out:
        kind = {bool: "boolean", int: "integer", float: "number", type(None): "null"}.get(type(value), "string")
        out[path] = Field_(path=path, type=kind)
