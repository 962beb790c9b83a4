"""The one place where farm errors become HTTP responses, and the request-size guard.

Each error class carries its status in ``envfarm.errors`` (the table both the server and the
SDK read); this module only renders ``{"error": {kind, message, ...}}`` bodies.
"""

from __future__ import annotations

import asyncio
import logging
import json
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from envfarm.errors import (
    BadRequest,
    EnvfarmError,
    ErrorKind,
    FarmNotReady,
    PayloadTooLarge,
    http_status,
    status_kind,
)
from envfarm.wire import Health

log = logging.getLogger("envfarm.farm")


def error_response(exc: EnvfarmError) -> JSONResponse:
    status = http_status(type(exc))
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    retry_after = exc.fields.get("retry_after_s")
    if isinstance(retry_after, int | float):
        # whole seconds, at least 1 (RFC 9110); the body keeps the exact figure
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return JSONResponse({"error": exc.to_dict()}, status_code=status, headers=headers or None)


def health_response(health: Health) -> JSONResponse:
    """``/healthz``: 200 when ready, 503 with ``Retry-After`` before (probes read the status)."""
    if health.ready:
        return JSONResponse(health.model_dump())
    return JSONResponse(health.model_dump(), status_code=503, headers={"Retry-After": "1"})


def error_body(status: int, kind: ErrorKind, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"kind": kind.value, "message": message, **extra}},
                        status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(EnvfarmError)
    async def _farm(_: Request, exc: EnvfarmError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", ""))}
                  for e in exc.errors()]
        return error_response(BadRequest(_summarize(errors), errors=errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_body(exc.status_code, status_kind(exc.status_code), str(exc.detail))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s", request.method, request.url.path,
                  exc_info=(type(exc), exc, exc.__traceback__))
        return error_body(500, ErrorKind.internal, f"internal error: {type(exc).__name__}")


def _summarize(errors: list[dict[str, Any]]) -> str:
    parts = [f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5]]
    return "invalid request: " + "; ".join(parts)


class BodyLimit:
    """Answer 413 to bodies over ``limit`` bytes, declared or streamed, before any handler runs."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await self._reject(scope, receive, send)
                    return
        if not any(k == b"content-length" for k, _ in scope.get("headers", ())):
            # Streamed body of unknown size: read it here (at most limit + 1 chunk), so an
            # oversized one gets a clean 413 before any handler starts parsing.
            body, more = [], True
            seen = 0
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    break
                body.append(message.get("body", b""))
                seen += len(body[-1])
                more = message.get("more_body", False)
                if seen > self.limit:
                    await self._reject(scope, receive, send)
                    return
            buffered = [{"type": "http.request", "body": b"".join(body), "more_body": False}]

            async def replay() -> Message:
                return buffered.pop() if buffered else await receive()

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)

    def _message(self) -> str:
        return f"request body is over the {self.limit} byte limit"

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(PayloadTooLarge(self._message(), limit=self.limit))
        await response(scope, receive, send)


class Drain:
    """Requests in flight, and whether the farm is stopping (see ``Draining``)."""

    def __init__(self) -> None:
        self.stopping = False
        self.in_flight = 0

    async def drain(self, timeout_s: float) -> int:
        """Refuse new requests and wait up to ``timeout_s`` for the in-flight ones; how many
        were still running at the end."""
        self.stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return self.in_flight


class Draining:
    """Counts requests in flight; once stopping, answers new ones 503 (with ``Retry-After``
    and ``Connection: close``) so a stop can wait for the in-flight ones to be answered."""

    def __init__(self, app: ASGIApp, state: Drain) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.state.stopping:
            response = error_response(FarmNotReady("the farm is stopping", retry_after_s=1.0))
            response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1


def bearer(request: Request) -> str | None:
    """The bearer token of a request, or None."""
    return bearer_value(request.headers.get("authorization", ""))


def bearer_value(value: str) -> str | None:
    """The token of an ``Authorization`` header value, if it is a bearer one."""
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), default=str).encode()
