"""Fast paths for the two one-call-per-request shapes that trainers send by the thousand.

``POST /envs/{env}/leases/{id}/call`` and an MCP ``tools/call`` POST spend more time in the
frameworks (FastAPI's routing, dependency solving and response model; FastMCP's transport,
dispatcher and middleware) than in the tool. Both are answered here straight from the ASGI
scope, for well-formed requests only: anything else (a missing or odd field, another MCP
method, an unknown tool, headers the MCP transport would reject) is replayed, byte for byte,
to the framework, so errors keep their framework-made shape. The answers are the ones the
framework gives (``CallResult`` JSON; FastMCP's ``CallToolResult``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from mcp.shared.inbound import (
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from envfarm.errors import EnvfarmError
from envfarm.farm._core import FarmCore
from envfarm.farm._http import bearer_value, error_response
from envfarm.models import CallResult, ToolSpec
from envfarm.wire import LEASE_ID_PATTERN

_CALL_PATH = re.compile(r"^/envs/([A-Za-z0-9_.\-]{1,200})/leases/(" + LEASE_ID_PATTERN[1:-1]
                        + r")/call$")
#: A lease's MCP endpoint, with its credential in the path or not (``_app``'s two routes).
_MCP_PATH = re.compile(r"^/envs/([A-Za-z0-9_.\-]{1,200})/leases/(" + LEASE_ID_PATTERN[1:-1]
                       + r")/mcp(?:/([^/]+))?$")
_JSON = b"application/json"
_MCP_PARAMS = frozenset({"name", "arguments", "_meta"})
# _meta keys that change nothing for a tool that sends no progress or other notifications.
_MCP_META = frozenset({"progressToken"})
_MODERN_META = "io.modelcontextprotocol/"  # the envelope; the SDK's ladder checks it
_SERVER_INFO = "io.modelcontextprotocol/serverInfo"


# -- ASGI plumbing -----------------------------------------------------------------------------
async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client went away first."""
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands out ``body`` again, then whatever the client sends next."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def again() -> Message:
        return pending.pop() if pending else await receive()

    return again


async def send_json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", _JSON),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def scope_header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


def bearer_of(scope: Scope) -> str | None:
    """The bearer token of the request, or None."""
    return bearer_value((scope_header(scope, b"authorization") or b"").decode("latin-1"))


def json_message(body: bytes) -> Any:
    """The parsed body, or None when it is not JSON."""
    try:
        return json.loads(body)
    except ValueError:
        return None


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# -- HTTP: POST /envs/{env}/leases/{id}/call ---------------------------------------------------
def call_request(body: bytes) -> tuple[str, dict[str, Any]] | None:
    """(tool, arguments) of a body ``CallRequest`` would accept as is; None to let it judge."""
    data = _json_object(body)
    if data is None or not data.keys() <= {"tool", "arguments"}:
        return None
    tool, arguments = data.get("tool"), data.get("arguments", {})
    if not isinstance(tool, str) or not 1 <= len(tool) <= 200 or not isinstance(arguments, dict):
        return None
    return tool, arguments


class FastCall:
    """Answers well-formed ``/call`` requests itself and hands a lease's MCP POSTs straight to
    its MCP handler (``mcp``); everything else goes on to ``app``."""

    def __init__(self, app: ASGIApp, core: FarmCore, mcp: ASGIApp | None = None) -> None:
        self.app = app
        self.core = core
        self.mcp = mcp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        post = scope["type"] == "http" and scope["method"] == "POST"
        match = _CALL_PATH.match(scope["path"]) if post else None
        if match is None and post and self.mcp is not None:
            mcp = _MCP_PATH.match(scope["path"])
            if mcp is not None:
                # Past FastAPI's routing (its MCP routes come after every other route's pattern)
                # with the path parameters its route would give.
                env, lease_id, cap = mcp.groups()
                scope["path_params"] = {"env": env, "lease_id": lease_id,
                                        **({"cap": cap} if cap is not None else {})}
                await self.mcp(scope, receive, send)
                return
        if match is None or not 3 <= len(match.group(2)) <= 100:
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the client is gone
        parsed = call_request(body)
        if parsed is None:
            await self.app(scope, replay(body, receive), send)
            return
        try:
            lease = self.core.lease(match.group(1), match.group(2), bearer_of(scope))
            self.core.admit_call(lease)
            result = await self.core.call(lease, *parsed)
        except EnvfarmError as exc:  # 401/403/404/410 (lease_lost included), 429
            await error_response(exc)(scope, receive, send)
            return
        await send_json(send, 200, result.model_dump_json().encode())


# -- MCP: one JSON-RPC tools/call --------------------------------------------------------------
def tool_answer(res: CallResult) -> tuple[str, dict[str, Any] | None, bool]:
    """(text content, structured content, is_error) of a call's MCP answer."""
    if res.ok:
        structured = res.result if isinstance(res.result, dict) else {"result": res.result}
        return json.dumps(res.result, default=str), structured, False
    error = res.error.model_dump() if res.error else {"kind": "env_error", "message": "?"}
    return f"{error['kind']}: {error['message']}", None, True


@dataclass(frozen=True)
class MCPCall:
    """A ``tools/call`` the fast path answers; ``modern``: the 2026-07-28 single-exchange era."""

    rid: int | str
    tool: str
    arguments: dict[str, Any]
    modern: bool


def _mcp_era(scope: Scope) -> bool | None:
    """True (modern), False (handshake era) if the transport takes these headers as is."""
    ctype = (scope_header(scope, b"content-type") or b"").split(b";")[0]
    if _JSON not in (p.strip() for p in ctype.split(b",")):
        return None
    accept = [t.split(b";")[0].strip().lower()
              for t in (scope_header(scope, b"accept") or b"").split(b",")]
    if not any(t in (_JSON, b"application/*", b"*/*") for t in accept):
        return None
    version = scope_header(scope, b"mcp-protocol-version")
    if version is None or version.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS:
        return False
    return True if version.decode("latin-1") in MODERN_PROTOCOL_VERSIONS else None


def _modern_ladder_passes(scope: Scope, msg: dict[str, Any], schema: dict[str, Any],
                          arguments: dict[str, Any]) -> bool:
    """The SDK's own checks of a modern request (envelope, routing and Mcp-Param headers)."""
    pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", ())]
    if find_duplicated_routing_header(pairs) is not None:
        return False
    headers = dict(pairs)
    if not isinstance(classify_inbound_request(msg, headers=headers), InboundModernRoute):
        return False
    if arguments or any(k.startswith("mcp-param-") for k in headers):
        return validate_mcp_param_headers(schema, arguments, headers) is None
    return True


def mcp_tools_call(scope: Scope, msg: Any, tools: dict[str, ToolSpec]) -> MCPCall | None:
    """A single, plain ``tools/call`` of a known tool that the transport would accept; else None
    (FastMCP answers it: other methods, batches, unknown tools, odd headers or fields).
    ``msg``: the parsed body (``json_message``)."""
    modern = _mcp_era(scope)
    if (modern is None or not isinstance(msg, dict)
            or msg.keys() != {"jsonrpc", "id", "method", "params"}
            or msg["jsonrpc"] != "2.0" or msg["method"] != "tools/call"):
        return None
    rid, params = msg["id"], msg["params"]
    if isinstance(rid, bool) or not isinstance(rid, int | str) or not isinstance(params, dict):
        return None
    name = params.get("name")
    spec = tools.get(name) if isinstance(name, str) else None
    if spec is None or not params.keys() <= _MCP_PARAMS:
        return None
    meta, arguments = params.get("_meta", {}), params.get("arguments", {})
    if not isinstance(meta, dict) or not isinstance(arguments, dict):
        return None
    if not all(k in _MCP_META or (modern and k.startswith(_MODERN_META)) for k in meta):
        return None
    if modern and not _modern_ladder_passes(scope, msg, spec.input_schema, arguments):
        return None
    return MCPCall(rid, spec.name, arguments, modern)


def mcp_response(call: MCPCall, res: CallResult, server_info: dict[str, str]) -> bytes:
    """FastMCP's JSON-RPC answer to the call (the modern era adds resultType and serverInfo)."""
    text, structured, is_error = tool_answer(res)
    result: dict[str, Any] = {"content": [{"text": text, "type": "text"}], "isError": is_error}
    if call.modern:
        result["resultType"] = "complete"
    if structured is not None:
        result["structuredContent"] = structured
    if call.modern:
        result["_meta"] = {_SERVER_INFO: server_info}
    return json.dumps({"jsonrpc": "2.0", "id": call.rid, "result": result},
                      separators=(",", ":"), ensure_ascii=False, default=str).encode()
