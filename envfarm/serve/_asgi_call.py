"""Run one HTTP request through an in-process ASGI app (for requests forwarded by handle)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message


class ForwardedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: str
    path: str
    query_string: bytes = b""
    headers: list[tuple[bytes, bytes]] = Field(default_factory=list)
    body: bytes = b""


class ForwardedResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: int
    headers: list[tuple[bytes, bytes]] = Field(default_factory=list)
    body: bytes = b""


async def call_asgi(app: ASGIApp, req: ForwardedRequest) -> ForwardedResponse:
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": req.method.upper(), "scheme": "http", "path": req.path,
        "raw_path": req.path.encode(), "root_path": "", "query_string": req.query_string,
        "headers": req.headers, "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80),
    }
    sent = False
    status = 500
    headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": req.body, "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return ForwardedResponse(status=status, headers=headers, body=b"".join(chunks))
