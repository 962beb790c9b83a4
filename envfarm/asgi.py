"""Call an ASGI app in-process: no sockets, no client object per call."""

from __future__ import annotations

import json
from typing import Any


async def asgi_request(app, method: str, path: str, query: str, body: bytes | None
                       ) -> tuple[int, bytes, str]:
    """One HTTP request through ``app``: ``(status, body, content_type)``."""
    headers = [(b"host", b"env.local")]
    if body is not None:
        headers += [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())]
    status, out_headers, out = await call_asgi(app, method, path, query.encode(), headers,
                                               body or b"", server=("env.local", 80))
    content_type = next((v.decode("latin-1") for k, v in out_headers
                         if k.lower() == b"content-type"), "")
    return status, out, content_type


async def call_asgi(app, method: str, path: str, query_string: bytes,
                    headers: list[tuple[bytes, bytes]], body: bytes, *,
                    server: tuple[str, int] = ("127.0.0.1", 80)
                    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """THE in-process ASGI driver (env calls, requests forwarded between Serve replicas):
    ``(status, headers, body)`` of one HTTP request, no sockets."""
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1", "method": method.upper(), "scheme": "http", "path": path,
        "raw_path": path.encode(), "root_path": "", "query_string": query_string,
        "headers": headers, "client": ("127.0.0.1", 0), "server": server, "state": {},
    }
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    status = 500
    out_headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status = message["status"]
            out_headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, out_headers, b"".join(chunks)


def decode_body(body: bytes, content_type: str) -> Any:
    if not body:
        return None
    if "json" in content_type or body[:1] in (b"{", b"["):
        try:
            return json.loads(body)
        except ValueError:
            pass
    return body.decode("utf-8", errors="replace")
