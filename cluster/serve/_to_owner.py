"""A lease request that reaches a pool replica other than its owner goes on to the owner.

That happens when routing falls back (the router's replica list lags a start or a stop, a
scaling race, HAProxy's table mid-reload). The replica hands the request on by handle, with
``owner=`` so ``LeaseRouter`` picks the owner, exactly once: the hop is marked, and a marked
request is answered where it lands. If the owner is gone, that is the core's 410 (the lease is
not in its table); a request is never served from a fresh state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from cluster.serve._forward import forward, owner_lost, to_response
from cluster.serve._router import owner_from_path
from envfarm.farm import error_response, read_body, scope_header
from envfarm.wire import ForwardedRequest

#: Marks a request already handed on once (its value: the replica that handed it on).
FORWARDED = b"x-envfarm-forwarded"


class ToOwner:
    """ASGI layer of a pool replica: requests naming another owner's lease go to the owner."""

    def __init__(self, app: ASGIApp, owner: str, pool: Callable[[], Any]) -> None:
        """``pool``: the handle of this replica's own deployment (looked up on first use)."""
        self.app = app
        self.owner = owner
        self._pool = pool
        self.handed_on = 0  # requests sent on to their owner (tests, operators)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        owner = owner_from_path(scope["path"]) if scope["type"] == "http" else None
        if owner is None or owner == self.owner or scope_header(scope, FORWARDED) is not None:
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the client is gone
        request = ForwardedRequest.of_scope(scope, body, [(FORWARDED, self.owner.encode())])
        self.handed_on += 1
        try:
            res = await forward(self._pool(), request)
        except Exception as exc:  # noqa: BLE001 - the owner died between routing and answer
            await error_response(owner_lost(owner, exc))(scope, receive, send)
            return
        await to_response(res)(scope, receive, send)
