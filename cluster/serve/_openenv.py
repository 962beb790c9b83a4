"""The OpenEnv endpoint through Serve: the front holds each socket, its session's lease lives in
a pool replica and every step reaches the lease's owner by handle (``LeaseRouter``), as a lease
API request (``PoolReplica.forward``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from cluster.serve._forward import forward, owner_lost
from cluster.serve._router import owner_from_path
from envfarm.catalog import Catalog
from envfarm.errors import EnvfarmError, FarmNotReady
from envfarm.farm import Tenants, TenantsConfig
from envfarm.wire import ForwardedRequest


class HandleLeaseAPI:
    """``envfarm.farm``'s ``LeaseAPI`` for the front: requests go to the env's pool by handle."""

    def __init__(self, catalog: Catalog, served: set[str], tenants: TenantsConfig,
                 handle: Callable[[str], Any]) -> None:
        """``handle``: env -> the handle of its pool deployment (``EnvNotFound`` if none)."""
        self.catalog = catalog
        self._served = sorted(served)
        self.tenants = Tenants(tenants)  # keys are checked again by the pool
        self._handle = handle

    def served(self) -> list[str]:
        return self._served

    def identify(self, key: str | None) -> str:
        return self.tenants.identify(key)

    async def request(self, method: str, path: str, body: Any = None,
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        path, _, query = path.partition("?")
        handle = self._handle(path.split("/")[2])  # /envs/<env>/...; EnvNotFound
        raw = b"" if body is None else json.dumps(body).encode()
        pairs = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        if raw:
            pairs.append((b"content-type", b"application/json"))
        request = ForwardedRequest(method=method, path=path, query_string=query.encode(),
                                   headers=pairs, body=raw)
        try:
            res = await forward(handle, request)
        except EnvfarmError:
            raise
        except Exception as exc:  # noqa: BLE001 - the replica died between routing and answer
            owner = owner_from_path(path)
            if owner:
                raise owner_lost(owner, exc) from None
            raise FarmNotReady(f"no pool replica answered ({type(exc).__name__}); retry",
                               retry_after_s=1.0) from None
        return res.status, res.body
