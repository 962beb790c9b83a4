"""The Door's direct hop: a lease's requests go over HTTP to its owner replica's own listener.

Behind the Door, a request used to reach its pool replica as a Ray actor call (a handle call
routed by ``LeaseRouter``). Measured under 256 leases (benchmarks/passes/2026-11-27-serve-hop.md)
that machinery, not the farm, was most of both processes' CPU: in the pool replica the farm's
own ASGI app took ~5 % of the busy samples, the rest was Ray's actor-call path (threads handing
the call to the event loop, serialization, the core worker). Now each pool replica opens its
own HTTP listener on its node (plain uvicorn, the replica's app as it is) the first time the
Door asks for it, by a handle call routed to that owner; the Door keeps owner -> address and
sends the lease's requests there on kept-alive connections. Requests naming no lease (new
leases: placement stays with ``LeaseRouter``) and leases whose owner is not running still go by
handle, which answers as before (410 where the owner is gone).

Nothing about isolation changes: the listener serves the same app (tokens, tenants, body
limits, the lease table), bound to the node address Serve's own replica ports already use;
an owner that dies closes its listener with it, so its leases get a typed 410 and no other
lease notices (blast radius one).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

import aiohttp
import uvicorn
from ray.exceptions import RayActorError
from yarl import URL
from starlette.types import ASGIApp

from cluster.serve._handles import fresh_call
from envfarm.wire import ForwardedRequest, ForwardedResponse, owner_of

#: Request headers the Door does not pass on (the hop's own; aiohttp writes host and length).
HOP_HEADERS = frozenset({b"host", b"content-length", b"connection", b"keep-alive",
                         b"transfer-encoding", b"upgrade", b"te", b"trailer", b"expect"})
#: The listener keeps idle connections longer than the Door does, so the Door never sends on a
#: connection the listener is closing (which would look like the owner dying).
LISTENER_KEEP_ALIVE_S = 3600
DOOR_KEEP_ALIVE_S = 60.0


class _NoSignals(uvicorn.Server):
    """uvicorn inside a Serve replica: Ray owns the process's signals."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        pass

    def capture_signals(self):  # type: ignore[override]  # uvicorn >= 0.29
        import contextlib

        return contextlib.nullcontext()


#: Where pool replicas open their listeners; unset: the node's IP (the Door may be on
#: another node). An embedded local Ray sets it to loopback: nothing off the machine reaches them.
LISTENER_HOST_ENV = "ENVFARM_LISTENER_HOST"


def listener_host(node_ip: str) -> str:
    return os.environ.get(LISTENER_HOST_ENV) or node_ip


class ReplicaListener:
    """A pool replica's own HTTP listener on ``host`` (an OS-picked port), opened on demand."""

    def __init__(self, app: ASGIApp, host: str) -> None:
        self.app, self.host = app, host
        self.url: str | None = None
        self._task: asyncio.Task | None = None

    def open(self) -> str:
        """Start serving (once; from the replica's event loop) and give the base URL."""
        if self._task is None:
            sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, 0))
            sock.listen(2048)
            sock.setblocking(False)
            port = sock.getsockname()[1]
            config = uvicorn.Config(self.app, lifespan="off", log_level="warning",
                                    access_log=False, timeout_keep_alive=LISTENER_KEEP_ALIVE_S,
                                    backlog=2048, server_header=False, date_header=False,
                                    proxy_headers=False)
            self._task = asyncio.get_running_loop().create_task(
                _NoSignals(config).serve(sockets=[sock]))
            host = f"[{self.host}]" if ":" in self.host else self.host
            self.url = f"http://{host}:{port}"
        assert self.url is not None
        return self.url


class OwnerLinks:
    """The Door's side: owner -> listener URL, and the kept-alive connections to them."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.urls: dict[str, str] = {}
        self.sent = 0  # requests that took the direct hop (tests, operators)
        self._session: aiohttp.ClientSession | None = None
        self._asking: dict[str, asyncio.Future] = {}

    async def url_of(self, owner: str) -> str | None:
        """The owner's listener, asked once by a handle call routed to the owner; None when the
        owner is not running (the call then lands on another replica, which says so)."""
        url = self.urls.get(owner)
        if url is not None:
            return url
        pending = self._asking.get(owner)
        if pending is None:  # one question per owner, however many requests wait on it
            pending = self._asking[owner] = asyncio.ensure_future(
                fresh_call(self.pool.listener, owner=owner))
            pending.add_done_callback(lambda _: self._asking.pop(owner, None))
        where = await asyncio.shield(pending)
        if where.get("owner") != owner:
            return None
        self.urls[owner] = where["url"]
        return where["url"]

    async def name_owners(self, res: ForwardedResponse) -> ForwardedResponse:
        """A lease-granting answer (a ``LeaseInfo`` or a list of them) with each lease's
        ``direct_url``: its owner's listener. As it was where that is not known."""
        try:
            data = json.loads(res.body)
            infos = data if isinstance(data, list) else [data]
            for info in infos:
                url = await self.url_of(owner_of(info["lease_id"]))
                if url is None:
                    return res
                info["direct_url"] = url
        except (ValueError, KeyError, TypeError, RayActorError):
            return res
        return res.model_copy(update={"body": json.dumps(data).encode()})

    def forget(self, owner: str) -> None:
        self.urls.pop(owner, None)

    async def send(self, url: str, request: ForwardedRequest) -> ForwardedResponse:
        """``request`` over HTTP to the listener at ``url``: the answer, whole. Raises
        ``aiohttp.ClientError`` (or ``OSError``) when the owner does not answer."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=DOOR_KEEP_ALIVE_S),
                auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, connect=10),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))
        target = url + request.path
        if request.query_string:
            target += "?" + request.query_string.decode("latin-1")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers
                   if k.lower() not in HOP_HEADERS]
        async with self._session.request(request.method, URL(target, encoded=True),
                                         data=request.body or None, headers=headers) as res:
            body = await res.read()
            self.sent += 1
            return ForwardedResponse(status=res.status, body=body, headers=[
                (k, v) for k, v in res.raw_headers if k.lower() not in HOP_HEADERS])
