"""The Door: a stateless HTTP ingress in front of a multi-replica pool under HAProxy ingress.

HAProxy picks the Door replica by load. A request naming a lease goes to the replica that owns
it: over HTTP to that replica's own listener (``hop="http"``, the default; see
``cluster.serve._direct``), or by handle with the owner read from the path, so ``LeaseRouter``
on the pool picks the owner (``hop="handle"``). Anything else (a new lease) goes by handle to
the replica ``LeaseRouter`` picks; a lease whose owner is gone gets 410. A plain deployment
(``__call__`` takes a Request), not ``@serve.ingress``: Serve allows one ASGI ingress per app,
and the pool behind is one.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import aiohttp
from ray.exceptions import ActorDiedError, RayActorError
from starlette.requests import Request
from starlette.responses import Response

from cluster.serve._direct import OwnerLinks
from cluster.serve._forward import forward, owner_lost, to_response
from cluster.serve._router import owner_from_path
from envfarm.errors import EnvfarmError, LeaseGone, PayloadTooLarge, PoolExhausted
from envfarm.farm import error_response
from envfarm.wire import ForwardedRequest, ForwardedResponse


Hop = Literal["http", "handle"]
_log = logging.getLogger("ray.serve")


class Door:
    """Ingress of a multi-replica pool app under HAProxy (see cluster.serve._ingress)."""

    def __init__(self, pool: Any, max_body_bytes: int, hop: Hop = "http") -> None:
        self.pool = pool
        self.max_body_bytes = max_body_bytes
        self.links = OwnerLinks(pool)
        self._hop: Hop = hop
        self.requests = 0  # all it was asked (operators, tests)

    async def __call__(self, request: Request) -> Response:
        self.requests += 1
        try:
            return await self._serve(request)
        except Exception:  # noqa: BLE001 - a bug here must not reach the client as Serve's bare 500
            # not the path: an MCP path carries the lease's credential
            _log.exception("the Door failed on a %s request", request.method)
            return error_response(EnvfarmError("the farm's Door failed on this request; see "
                                               "its replica log"))

    async def _serve(self, request: Request) -> Response:
        body = await request.body()
        if len(body) > self.max_body_bytes:
            return error_response(PayloadTooLarge(
                f"request body is over the {self.max_body_bytes} byte limit",
                limit=self.max_body_bytes))
        fwd = ForwardedRequest.of_scope(request.scope, body)
        owner = owner_from_path(fwd.path)
        if owner is not None and self._hop == "http":
            direct = await self._to_owner(owner, fwd)
            if direct is not None:
                return direct
        try:
            return await self._answer(fwd, await forward(self.pool, fwd))
        except RayActorError as exc:
            # Retry only where nothing can have happened: no lease state (a new lease, the
            # catalog) and a replica that is dead, not merely unreachable (a live one may have
            # made the lease already; the client gets a retryable error and decides).
            if owner is not None or not isinstance(exc, ActorDiedError):
                return error_response(_replica_lost(owner, exc))
        try:
            return await self._answer(fwd, await forward(self.pool, fwd))
        except RayActorError as again:
            return error_response(_replica_lost(None, again))

    async def _to_owner(self, owner: str, fwd: ForwardedRequest) -> Response | None:
        """The lease's request over HTTP to its owner's listener; None when the owner is not
        running (the handle path then answers, 410 from another replica)."""
        try:
            url = await self.links.url_of(owner)
        except RayActorError as exc:
            return error_response(_replica_lost(owner, exc))
        if url is None:
            return None
        try:
            res = await self.links.send(url, fwd)
        except (aiohttp.ClientError, OSError) as exc:
            # The owner's listener closed or refused: its process (and the lease's state) is
            # gone with it. Ask again next time: a live owner answers with its address.
            self.links.forget(owner)
            return error_response(owner_lost(owner, exc))
        return await self._answer(fwd, res)

    async def _answer(self, fwd: ForwardedRequest, res: ForwardedResponse) -> Response:
        """The answer as HTTP; new leases (one, a batch, a fork) name their owner's listener
        (``LeaseInfo.direct_url``) on the direct hop, so a client in the cluster may send their
        requests there itself, past HAProxy and this Door."""
        if (self._hop == "http" and res.status in (200, 201) and fwd.method == "POST"
                and fwd.path.endswith(("/leases", "/leases:batch", "/fork"))):
            res = await self.links.name_owners(res)
        return to_response(res)

    async def hop(self, kind: Hop | None = None) -> dict[str, Any]:
        """How lease requests reach their owner (set it with ``kind``), how many requests came
        and how many took the direct hop so far (operators, benchmarks, tests)."""
        if kind is not None:
            self._hop = kind
        return {"hop": self._hop, "requests": self.requests, "sent_direct": self.links.sent,
                "owners": len(self.links.urls),
                "listeners": sorted(self.links.urls.values())}


def _replica_lost(owner: str | None, exc: RayActorError) -> EnvfarmError:
    """The replica died (or dropped) under an in-flight request: a typed answer, not Serve's
    bare 500. A lease's state died with its owner; anything else may be retried."""
    if owner is not None and isinstance(exc, ActorDiedError):
        return LeaseGone(f"replica {owner!r} that owned this lease died during the call; its "
                         "state is lost, start a new lease", owner=owner)
    return PoolExhausted("the replica serving this request is unavailable; retry",
                         retryable=True)
