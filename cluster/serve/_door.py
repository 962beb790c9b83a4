"""The Door: a stateless HTTP ingress in front of a multi-replica pool under HAProxy ingress.

HAProxy picks the Door replica by load; the Door forwards the request by handle, with the owner
read from the path, so ``LeaseRouter`` on the pool sends it to the replica that owns the lease
(or to any replica for a new lease; a lease whose owner is gone gets 410 there). A plain
deployment (``__call__`` takes a Request), not ``@serve.ingress``: Serve allows one ASGI ingress
per app, and the pool behind is one.
"""

from __future__ import annotations

from typing import Any

from ray.exceptions import ActorDiedError, RayActorError
from starlette.requests import Request
from starlette.responses import Response

from cluster.serve._forward import forward, to_response
from cluster.serve._router import owner_from_path
from envfarm.errors import EnvfarmError, LeaseGone, PayloadTooLarge, PoolExhausted
from envfarm.farm import error_response
from envfarm.wire import ForwardedRequest


class Door:
    """Ingress of a multi-replica pool app under HAProxy (see cluster.serve._ingress)."""

    def __init__(self, pool: Any, max_body_bytes: int) -> None:
        self.pool = pool
        self.max_body_bytes = max_body_bytes

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        if len(body) > self.max_body_bytes:
            return error_response(PayloadTooLarge(
                f"request body is over the {self.max_body_bytes} byte limit",
                limit=self.max_body_bytes))
        fwd = ForwardedRequest.of_scope(request.scope, body)
        try:
            return to_response(await forward(self.pool, fwd))
        except RayActorError as exc:
            # Retry only where nothing can have happened: no lease state (a new lease, the
            # catalog) and a replica that is dead, not merely unreachable (a live one may have
            # made the lease already; the client gets a retryable error and decides).
            owner = owner_from_path(fwd.path)
            if owner is not None or not isinstance(exc, ActorDiedError):
                return error_response(_replica_lost(owner, exc))
        try:
            return to_response(await forward(self.pool, fwd))
        except RayActorError as again:
            return error_response(_replica_lost(None, again))


def _replica_lost(owner: str | None, exc: RayActorError) -> EnvfarmError:
    """The replica died (or dropped) under an in-flight request: a typed answer, not Serve's
    bare 500. A lease's state died with its owner; anything else may be retried."""
    if owner is not None and isinstance(exc, ActorDiedError):
        return LeaseGone(f"replica {owner!r} that owned this lease died during the call; its "
                         "state is lost, start a new lease", owner=owner)
    return PoolExhausted("the replica serving this request is unavailable; retry",
                         retryable=True)
