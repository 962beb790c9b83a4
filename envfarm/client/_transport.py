"""The SDK's one-method transport interface, over real HTTP or an in-process ASGI app.

Two HTTP clients: ``AiohttpTransport`` (the default, ``HTTPTransport``) and ``HttpxTransport``.
Measured with the same SDK calls against a server that does no work
(``benchmarks/farm/bench_sdk_transport.py``, RESULTS.md "SDK transport"), httpx costs several times
aiohttp's client CPU per call, CPU a trainer's machine then lacks for the farm or the model.
"""

from __future__ import annotations

import asyncio
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


#: Idle connections are closed after this long, before the server's keep-alive (uvicorn: 5 s)
#: ends: a reused connection would otherwise race the server's close, and a tool call (not
#: retryable) fail.
KEEPALIVE_S = 3.0


class AiohttpTransport:
    """aiohttp with one pooled session, sized for thousands of concurrent leases."""

    def __init__(self, base_url: str, *, max_connections: int = 1024, timeout_s: float = 60.0
                 ) -> None:
        import aiohttp  # here: `import envfarm.client` stays light

        # nothing left us: no connection made (refused, or its connect timeout passed)
        self._errors = ((aiohttp.ClientConnectorError,
                         getattr(aiohttp, "ConnectionTimeoutError", aiohttp.ClientConnectorError)),
                        aiohttp.ClientError)
        self.base = base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._make = lambda: aiohttp.ClientSession(  # noqa: E731 - needs the running loop
            connector=aiohttp.TCPConnector(limit=max_connections, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=timeout_s, connect=10.0),
            headers=NO_DISCONNECT_WATCH)

    async def request(self, method: str, path: str, *, json: Any = None,
                      headers: dict[str, str] | None = None) -> Reply:
        if self._session is None:
            self._session = self._make()
        refused, failed = self._errors
        try:
            async with self._session.request(method, self.base + path, json=json,
                                             headers=headers) as r:
                body = await r.read()
                return Reply(status=r.status, body=body,
                             headers={k.lower(): v for k, v in r.headers.items()})
        except refused as exc:
            raise TransportError(f"could not reach the farm: {exc!r}", sent=False) from exc
        except (failed, asyncio.TimeoutError) as exc:
            raise TransportError(f"request to the farm failed: {exc!r}", sent=True) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class HttpxTransport:
    """httpx with one pooled client, sized for thousands of concurrent leases."""

    def __init__(self, base_url: str, *, max_connections: int = 1024, timeout_s: float = 60.0,
                 client: httpx.AsyncClient | None = None) -> None:
        self.client = client or httpx.AsyncClient(
            base_url=base_url.rstrip("/"), timeout=httpx.Timeout(timeout_s, connect=10.0),
            headers=NO_DISCONNECT_WATCH,
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections,
                                keepalive_expiry=KEEPALIVE_S),
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


#: The SDK's default HTTP transport (chosen by measurement: see the module docstring).
HTTPTransport = AiohttpTransport


class ASGITransport(HttpxTransport):
    """Talk to a farm app in this process (tests, ``--no-ray`` embedding); no sockets."""

    def __init__(self, app: Any, *, timeout_s: float = 60.0) -> None:
        super().__init__("http://envfarm.local", client=httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://envfarm.local",
            timeout=timeout_s))
