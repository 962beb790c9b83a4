"""Turn a FastAPI app's operations into tools, and flat tool arguments back into requests."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from envfarm.errors import AgentError
from envfarm.models import ToolSpec

_METHODS = ("get", "post", "put", "patch", "delete")
_REF = re.compile(r"^#/components/schemas/(.+)$")


@dataclass
class Operation:
    """One FastAPI operation: how to route a tool call to it."""

    spec: ToolSpec
    method: str
    path: str
    path_params: list[str] = field(default_factory=list)
    query_params: list[str] = field(default_factory=list)
    body_fields: list[str] | None = None  # None: no body; [] with whole_body: raw "body" arg
    whole_body: bool = False
    required: set[str] = field(default_factory=set)

    @property
    def allowed(self) -> set[str]:
        return set(self.spec.input_schema.get("properties", {}))

    def build_request(self, args: dict[str, Any]) -> tuple[str, str, bytes | None]:
        """``(path, query_string, json_body)`` for flat arguments; AgentError when they don't fit."""
        unknown = sorted(set(args) - self.allowed)
        if unknown:
            raise AgentError(
                f"tool {self.spec.name!r} got unknown argument(s) {', '.join(unknown)}; "
                f"it accepts: {', '.join(sorted(self.allowed)) or 'no arguments'}")
        missing = sorted(k for k in self.required if args.get(k) is None)
        if missing:
            raise AgentError(f"tool {self.spec.name!r} is missing required argument(s) "
                             f"{', '.join(missing)}")
        path = self.path
        for name in self.path_params:
            value = args[name]
            if isinstance(value, (dict, list)):
                raise AgentError(f"argument {name!r} of {self.spec.name!r} must be a scalar")
            path = path.replace("{" + name + "}", quote(_scalar(value), safe=""))
        query: list[tuple[str, str]] = []
        for name in self.query_params:
            value = args.get(name)
            if value is None:
                continue
            for item in value if isinstance(value, list) else [value]:
                query.append((name, _scalar(item)))
        body = None
        if self.whole_body:
            if "body" in args:
                body = _dumps(args["body"])
        elif self.body_fields is not None:
            body = _dumps({k: args[k] for k in self.body_fields if k in args})
        return path, urlencode(query), body


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _dumps(value: Any) -> bytes:
    try:
        return json.dumps(value, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise AgentError(f"arguments are not valid JSON: {exc}") from exc


def extract_operations(app, openapi: dict[str, Any] | None = None
                       ) -> tuple[dict[str, Operation], list[str]]:
    """Operations by tool name (operation_id), plus problems found (e.g. duplicate ids).
    ``openapi``: the app's document made already (``openapi_for_tools``); else ``app.openapi()``."""
    if openapi is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # generated apps often have duplicate-id warnings
            openapi = app.openapi()
    components = openapi.get("components", {}).get("schemas", {})
    ops: dict[str, Operation] = {}
    problems: list[str] = []
    for path, item in openapi.get("paths", {}).items():
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            name = op.get("operationId") or f"{method}_{path}"
            if name in ops:
                problems.append(f"duplicate operation_id {name!r} ({method.upper()} {path}); "
                                "only the first is a tool")
                continue
            ops[name] = _operation(name, method, path, op, components)
    return ops, problems


def _operation(name: str, method: str, path: str, op: dict, components: dict) -> Operation:
    props: dict[str, Any] = {}
    required: set[str] = set()
    result = Operation(spec=ToolSpec(name=name), method=method.upper(), path=path)
    for param in op.get("parameters", []):
        where = param.get("in")
        if where not in ("path", "query"):
            continue
        schema = dict(param.get("schema", {}))
        if param.get("description"):
            schema.setdefault("description", param["description"])
        props[param["name"]] = schema
        (result.path_params if where == "path" else result.query_params).append(param["name"])
        if param.get("required"):
            required.add(param["name"])
    body = op.get("requestBody")
    if body:
        schema = body.get("content", {}).get("application/json", {}).get("schema", {})
        resolved = _resolve(schema, components)
        if "properties" in resolved:
            result.body_fields = list(resolved["properties"])
            for key, sub in resolved["properties"].items():
                props.setdefault(key, sub)
            if body.get("required", False):
                required |= set(resolved.get("required", []))
        else:
            result.whole_body = True
            props["body"] = schema
            if body.get("required", False):
                required.add("body")
    input_schema: dict[str, Any] = {"type": "object", "properties": props,
                                    "additionalProperties": False}
    if required:
        input_schema["required"] = sorted(required)
    defs = _collect_defs(props, components)
    if defs:
        input_schema["$defs"] = defs
    input_schema = _rewrite_refs(input_schema)
    summary, description = op.get("summary", ""), op.get("description", "")
    text = summary if not description or description == summary else f"{summary}\n\n{description}"
    result.spec = ToolSpec(name=name, description=text.strip(), input_schema=input_schema)
    result.required = required
    return result


def _resolve(schema: dict, components: dict) -> dict:
    """Follow $refs, and unwrap ``Optional[Model]`` (anyOf [model, null]) bodies."""
    options = [o for o in schema.get("anyOf", schema.get("oneOf", [])) if o.get("type") != "null"]
    if len(options) == 1:
        schema = options[0]
    seen = 0
    while "$ref" in schema and seen < 20:
        match = _REF.match(schema["$ref"])
        if not match or match.group(1) not in components:
            break
        schema = components[match.group(1)]
        seen += 1
    return schema


def _collect_defs(node: Any, components: dict, out: dict | None = None) -> dict:
    out = {} if out is None else out
    if isinstance(node, dict):
        ref = node.get("$ref")
        match = _REF.match(ref) if isinstance(ref, str) else None
        if match and match.group(1) in components and match.group(1) not in out:
            out[match.group(1)] = components[match.group(1)]
            _collect_defs(components[match.group(1)], components, out)
        for value in node.values():
            _collect_defs(value, components, out)
    elif isinstance(node, list):
        for value in node:
            _collect_defs(value, components, out)
    return out


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (_REF.sub(r"#/$defs/\1", v) if k == "$ref" and isinstance(v, str)
                    else _rewrite_refs(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node


def openapi_as_fastapi_mcp(app: Any) -> dict[str, Any]:
    """The env app's OpenAPI, generated the way fastapi-mcp's server does (from its routes):
    what ``envfarm.farm`` renders MCP tool listings from, as AWM's server does."""
    from fastapi.openapi.utils import get_openapi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate operation ids, as in extract_operations
        return get_openapi(title=app.title, version=app.version,
                           openapi_version=app.openapi_version, description=app.description,
                           routes=app.routes)


def openapi_for_tools(app: Any) -> dict[str, Any] | None:
    """``openapi_as_fastapi_mcp(app)`` when the tools read from it are those ``app.openapi()``
    gives, so one schema generation serves both (each costs ~0.1 CPU-s per env: a third of a
    cold start). None where they may differ: an app that overrides its ``openapi``, has
    webhooks, or merges input and output schemas; or whose schema does not render this way."""
    from fastapi import FastAPI

    if (not isinstance(app, FastAPI) or "openapi" in vars(app) or app.webhooks.routes
            or not app.separate_input_output_schemas):
        return None
    try:
        return openapi_as_fastapi_mcp(app)
    except Exception:  # noqa: BLE001 - generated code's schema: app.openapi() then says why
        return None
