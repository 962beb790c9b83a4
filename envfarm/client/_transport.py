"""The SDK's one-method transport interface, over real HTTP or an in-process ASGI app."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from envfarm.errors import TransportError


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


class Transport(Protocol):
    """Send one request; raise ``TransportError`` (``sent=False`` when nothing left us)."""

    async def request(self, method: str, path: str, *, json: Any = None,
                      headers: dict[str, str] | None = None) -> Reply: ...

    async def aclose(self) -> None: ...


#: Sent with every request: Serve then runs the request without watching for the client to hang
#: up (no receive task and no request task per request under HAProxy ingress; measured ~8 % more
#: one-call requests per second). A call the farm received runs to its end either way, bounded
#: by the env's call timeout, instead of being cancelled halfway by a dropped connection.
NO_DISCONNECT_WATCH = {"x-request-disconnect-disabled": "?1"}


class HTTPTransport:
    """httpx with one pooled client, sized for thousands of concurrent leases."""

    def __init__(self, base_url: str, *, max_connections: int = 1024, timeout_s: float = 60.0,
                 client: httpx.AsyncClient | None = None) -> None:
        self.client = client or httpx.AsyncClient(
            base_url=base_url.rstrip("/"), timeout=httpx.Timeout(timeout_s, connect=10.0),
            headers=NO_DISCONNECT_WATCH,
            # keepalive_expiry < uvicorn's 5 s keep-alive: a reused idle connection otherwise
            # races the server's close, and a tool call (not retryable) fails with ReadError
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections, keepalive_expiry=3.0),
        )

    async def request(self, method: str, path: str, *, json: Any = None,
                      headers: dict[str, str] | None = None) -> Reply:
        try:
            r = await self.client.request(method, path, json=json, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise TransportError(f"could not reach the farm: {exc!r}", sent=False) from exc
        except httpx.HTTPError as exc:
            raise TransportError(f"request to the farm failed: {exc!r}", sent=True) from exc
        return Reply(status=r.status_code, body=r.content, headers=dict(r.headers))

    async def aclose(self) -> None:
        await self.client.aclose()


class ASGITransport(HTTPTransport):
    """Talk to a farm app in this process (tests, ``--no-ray`` embedding); no sockets."""

    def __init__(self, app: Any, *, timeout_s: float = 60.0) -> None:
        super().__init__("http://envfarm.local", client=httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://envfarm.local",
            timeout=timeout_s))
