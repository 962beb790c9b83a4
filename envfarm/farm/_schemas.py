"""Tool listings as AWM's own server renders them.

AWM serves each env with fastapi-mcp, whose tools models trained on AWM have seen: every
parameter has a top-level ``type`` (an optional field, ``anyOf: [{type: X}, {type: null}]``,
also says ``type: X``; without it a client shows "unknown"), titles are the parameter names,
and a description is the summary, the description and the success response with an example.
``rendering="fastapi-mcp"`` (the default) lists tools through fastapi-mcp's own converter, run
on the env's OpenAPI; ``"envfarm"`` lists the runtime's plain merged schemas.

Only MCP lists them so (what AWM's client reads). HTTP ``/tools`` keeps the runtime's exact
schemas: a ``type`` beside ``anyOf`` makes ``null`` invalid under JSON Schema although the env
accepts it, and trainers validate agents' arguments against the listing (the reference
solution of project_management_1 task 6 passes ``assignee_id: null``). One deviation:
for a union of several non-null types fastapi-mcp picks one from a ``set`` (its order varies
between processes, so replicas would disagree); here it is the first, as the union lists them.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

from envfarm.farm._config import ToolRendering
from envfarm.models import ToolSpec

if TYPE_CHECKING:
    from envfarm.farm._served import ServedEnv

log = logging.getLogger("envfarm.farm")


def render_tools(served: ServedEnv, rendering: ToolRendering = "fastapi-mcp") -> list[ToolSpec]:
    """The env's tools as MCP ``tools/list`` lists them (``served.openapi``: the env app's
    OpenAPI as fastapi-mcp generates it, made where the env's code runs)."""
    if rendering == "envfarm" or not served.openapi:
        return served.tools
    with warnings.catch_warnings():  # fastapi-mcp 0.4.0 trips pydantic's deprecations
        warnings.simplefilter("ignore", DeprecationWarning)
        from fastapi_mcp.openapi.convert import convert_openapi_to_mcp_tools

    try:
        converted = {t.name: t for t in convert_openapi_to_mcp_tools(served.openapi)[0]}
    except Exception as exc:  # noqa: BLE001 - generated code's schema may not render
        log.warning("%s: fastapi-mcp cannot render its tools (%s: %s); listing plain schemas",
                    served.name, type(exc).__name__, exc)
        return served.tools
    out = []
    for spec in served.tools:
        tool = converted.get(spec.name)
        if tool is None:
            out.append(spec)
            continue
        schema = dict(tool.input_schema)
        schema["properties"] = {name: first_type(prop)
                                for name, prop in schema.get("properties", {}).items()}
        out.append(ToolSpec(name=spec.name, description=tool.description or spec.description,
                            input_schema=schema))
    return out


def first_type(prop: dict[str, Any]) -> dict[str, Any]:
    """``type`` = the first non-null member of ``anyOf`` (where the union has one)."""
    members = [m.get("type") for m in prop.get("anyOf", ()) if isinstance(m, dict)]
    first = next((t for t in members if isinstance(t, str) and t != "null"), None)
    if first is None or prop.get("type") == first:
        return prop
    return {**prop, "type": first}
