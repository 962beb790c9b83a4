"""THE hop of a whole HTTP request from one farm process to the pool replica that serves it.

Four places hand requests on (the front's route for packed envs, its OpenEnv steps, a pool
app's door, a replica that got another owner's lease): each builds an
``envfarm.wire.ForwardedRequest``, sends it with :func:`forward` and turns the answer back into
HTTP with :func:`to_response`. How a lost replica is answered stays with each of them.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from cluster.serve._handles import fresh_call
from cluster.serve._router import owner_from_path
from envfarm.errors import LeaseGone
from envfarm.wire import ForwardedRequest, ForwardedResponse


async def forward(handle: Any, request: ForwardedRequest) -> ForwardedResponse:
    """``request`` to ``handle``'s deployment (``PoolReplica.forward``): to the replica that owns
    the lease its path names (``LeaseRouter``), any replica where it names none."""
    return await fresh_call(handle.forward, request, owner=owner_from_path(request.path))


def to_response(res: ForwardedResponse) -> Response:
    """The forwarded answer as HTTP: its status, body and headers as they came (their
    content-length set anew)."""
    response = Response(res.body, status_code=res.status)
    response.raw_headers = [*((k, v) for k, v in res.headers if k.lower() != b"content-length"),
                            (b"content-length", str(len(res.body)).encode())]
    return response


def owner_lost(owner: str, exc: BaseException) -> LeaseGone:
    """The replica that owns a lease did not answer a request handed on to it: its state is
    gone with it."""
    return LeaseGone(f"the replica {owner!r} that owns this lease did not answer "
                     f"({type(exc).__name__}); its state is lost, start a new lease", owner=owner)
