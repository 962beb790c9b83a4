"""MCP per lease: ``/envs/{env}/leases/{id}/mcp`` speaks streamable HTTP (stateless, JSON).

One FastMCP server per env carries the env's tools; the lease comes from the request: the
endpoint checks the lease and its bearer token, puts the lease in the ASGI scope, and the tool
reads it back from the current HTTP request. Tool calls go through ``FarmCore.call``, so MCP and
the HTTP API see (and change) the same instance. A plain single ``tools/call`` POST (what an
agent loop sends once per step) is answered without FastMCP (``envfarm.farm._fastpath``): its
transport, dispatcher and middleware cost more than the tool itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.dependencies import get_http_request
from fastmcp.tools.base import Tool, ToolResult
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from envfarm.errors import EnvfarmError
from envfarm.farm._capability import credential_matches
from envfarm.farm._core import FarmCore
from envfarm.farm._fastpath import (
    json_message,
    mcp_response,
    mcp_tools_call,
    read_body,
    replay,
    send_json,
    tool_answer,
)
from envfarm.farm._http import bearer, error_response
from envfarm.farm._lease import LeaseRecord
from envfarm.models import ToolSpec

_LEASE_KEY = "envfarm.lease"


class _LeaseTool(Tool):
    """An env tool whose calls go to the lease named by the current HTTP request."""

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        scope = get_http_request().scope
        core: FarmCore = scope[_LEASE_KEY + ".core"]
        lease: LeaseRecord = core.held(scope[_LEASE_KEY])  # still open after FastMCP's dispatch
        text, structured, is_error = tool_answer(await core.call(lease, self.name, arguments))
        return ToolResult(content=text, structured_content=structured, is_error=is_error)


def _server(env: str, tools: list[ToolSpec]) -> FastMCP:
    server = FastMCP(name=f"envfarm-{env}", on_duplicate="replace")
    for spec in tools:
        server.add_tool(_LeaseTool(name=spec.name, description=spec.description or spec.name,
                                   parameters=spec.input_schema))
    return server


class LeaseMCP:
    """The MCP endpoint of every lease of one farm core (one FastMCP app per env)."""

    def __init__(self, core: FarmCore, fast_path: bool = True) -> None:
        self.core = core
        self.fast_path = fast_path
        self.fast_calls = 0  # tools/call answered without FastMCP (tests, operators)
        self.tools: dict[str, dict[str, ToolSpec]] = {}
        self.server_info: dict[str, dict[str, str]] = {}
        self.apps: dict[str, ASGIApp] = {}
        self._lifespans: list[Any] = []
        for env in core.tool_specs:
            self._lifespans.append(self._add(env))
        # Types loaded on demand get their MCP app at their first MCP request: its session
        # manager then runs in a task of its own until the farm stops.
        self._late: dict[str, asyncio.Task[None]] = {}
        self._started: dict[str, asyncio.Event] = {}
        self._stop = asyncio.Event()

    def _add(self, env: str) -> Any:
        specs = self.core.tool_specs[env]
        self.tools[env] = {t.name: t for t in specs}
        server = _server(env, specs)
        self.server_info[env] = {"name": server.name, "version": str(server.version)}
        app = server.http_app(
            path="/", stateless_http=True, json_response=True, host_origin_protection=False)
        self.apps[env] = app
        return app

    async def _app_for(self, env: str) -> ASGIApp:
        if env not in self.apps:
            app = self._add(env)
            self._started[env] = started = asyncio.Event()

            async def hold() -> None:
                async with app.router.lifespan_context(app):
                    started.set()
                    await self._stop.wait()

            self._late[env] = asyncio.create_task(hold(), name=f"envfarm-mcp-{env}")
        task, started = self._late.get(env), self._started.get(env)
        if task is not None and not started.is_set():  # concurrent first requests all wait
            await asyncio.wait([task, asyncio.ensure_future(started.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                task.result()
        return self.apps[env]

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Run every MCP app's session manager for the life of the farm app."""
        async with AsyncExitStack() as stack:
            for app in self._lifespans:
                await stack.enter_async_context(app.router.lifespan_context(app))
            try:
                yield
            finally:
                self._stop.set()
                await asyncio.gather(*self._late.values(), return_exceptions=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = scope.get("path_params", {})
        env, lease_id = params.get("env", ""), params.get("lease_id", "")
        body = None
        if scope["method"] == "POST":
            # The body first, then the lease: a lease released while the body was on its way
            # must not lend its (recycled) instance to the request.
            body = await read_body(receive)
            if body is None:
                return  # the client is gone
        try:
            lease = self.core.lease(env, lease_id, self._token(scope, lease_id))
            message = json_message(body) if body else None
            calls = tool_calls(message)
            for _ in range(calls):
                self.core.admit_call(lease)
        except EnvfarmError as exc:
            await error_response(exc)(scope, receive, send)
            return
        lease.agent_requests += 1
        if lease.env not in self.tools:  # a type loaded on demand since the farm started
            await self._app_for(lease.env)
        if body is not None:
            if self.fast_path:
                call = mcp_tools_call(scope, message, self.tools[lease.env])
                if call is not None:
                    self.fast_calls += 1
                    try:
                        res = await self.core.call(lease, call.tool, call.arguments)
                    except EnvfarmError as exc:  # the lease was lost with its worker
                        await error_response(exc)(scope, receive, send)
                        return
                    await send_json(send, 200,
                                    mcp_response(call, res, self.server_info[lease.env]))
                    return
            receive = replay(body, receive)
        inner = dict(scope)
        inner[_LEASE_KEY] = lease
        inner[_LEASE_KEY + ".core"] = self.core
        inner["path"] = "/"
        inner["raw_path"] = b"/"
        inner["root_path"] = ""
        await (await self._app_for(lease.env))(inner, receive, send)

    def _token(self, scope: Scope, lease_id: str) -> str | None:
        """The bearer token, or the lease's own token when the path holds its MCP credential
        (a wrong credential, or one of another lease, gives a token that matches nothing)."""
        credential = scope.get("path_params", {}).get("cap")
        if credential is None:
            return bearer(Request(scope))
        lease = self.core.leases.get(lease_id)
        if lease is not None and credential_matches(lease.token, credential):
            return lease.token
        return "\x00wrong-credential"


def tool_calls(message: Any) -> int:
    """How many ``tools/call`` messages a parsed JSON-RPC body (one message or a batch) holds."""
    messages = message if isinstance(message, list) else [message]
    return sum(isinstance(m, dict) and m.get("method") == "tools/call" for m in messages)
