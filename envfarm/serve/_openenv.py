"""The OpenEnv endpoint through Serve: the front holds each socket, its session's lease lives in
a pool replica and every step reaches the lease's owner by handle (``LeaseRouter``), as a lease
API request (``PoolReplica.forward``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from envfarm.catalog import Catalog
from envfarm.errors import EnvfarmError, FarmNotReady, LeaseGone
from envfarm.farm import Tenants
from envfarm.serve._handles import fresh_call
from envfarm.serve._router import owner_from_path

if TYPE_CHECKING:
    from envfarm.serve._deployments import Front


class HandleLeaseAPI:
    """``envfarm.farm``'s ``LeaseAPI`` for the front: requests go to the env's pool by handle."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.tenants = Tenants(front.config.tenants)  # keys are checked again by the pool

    @property
    def catalog(self) -> Catalog:
        return self.front.catalog

    def served(self) -> list[str]:
        return sorted(self.front.routes)

    def identify(self, key: str | None) -> str:
        return self.tenants.identify(key)

    async def request(self, method: str, path: str, body: Any = None,
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        from envfarm.serve._deployments import ForwardedRequest

        path, _, query = path.partition("?")
        handle = self.front.handle(path.split("/")[2])  # /envs/<env>/...; EnvNotFound
        raw = b"" if body is None else json.dumps(body).encode()
        pairs = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        if raw:
            pairs.append((b"content-type", b"application/json"))
        owner = owner_from_path(path)
        request = ForwardedRequest(method=method, path=path, query_string=query.encode(),
                                   headers=pairs, body=raw)
        try:
            res = await fresh_call(handle.forward, request, owner=owner)
        except EnvfarmError:
            raise
        except Exception as exc:  # noqa: BLE001 - the replica died between routing and answer
            if owner:
                raise LeaseGone(f"the replica {owner!r} that owns this lease did not answer "
                                f"({type(exc).__name__}); start a new lease",
                                owner=owner) from None
            raise FarmNotReady(f"no pool replica answered ({type(exc).__name__}); retry",
                               retry_after_s=1.0) from None
        return res.status, res.body
