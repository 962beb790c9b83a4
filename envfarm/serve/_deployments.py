"""The two Serve deployments: a pool replica (one or several envs) and the front app.

Both are thin: a pool replica is a ``FarmCore`` plus its FastAPI app; the front serves the
catalog and health, fans metrics in, runs the batched path and forwards packed envs' requests,
all through DeploymentHandles routed by ``LeaseRouter``.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import defaultdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve
from starlette.types import ASGIApp, Receive, Scope, Send

from envfarm.catalog import load_catalog
from envfarm.errors import EnvNotFound
from envfarm.farm import (
    BatchItem,
    BatchRequest,
    BatchResponse,
    BatchResult,
    FarmConfig,
    FarmCore,
    LeaseRequest,
    build_app,
    owner_of,
)
from envfarm.farm._http import error_response, install_error_handlers
from envfarm.farm._metrics import merge_exposition
from envfarm.farm._wire import BatchError, EnvSummary
from envfarm.serve._asgi_call import ForwardedRequest, ForwardedResponse, call_asgi
from envfarm.serve._handles import fresh_call
from envfarm.serve._router import INDEX_PREFIX, owner_from_path


class _FullPath:
    """Serve strips the route prefix into root_path; the farm app routes on full paths."""

    def __init__(self, app: ASGIApp) -> None:
        self._asgi = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope.get("root_path"):
            scope = dict(scope, root_path="")
        await self._asgi(scope, receive, send)


def _owner_tag() -> str:
    # Replica ids are alphanumeric today; keep only safe characters in case that changes.
    return re.sub(r"[^A-Za-z0-9_]", "", serve.get_replica_context().replica_id.unique_id)


@serve.ingress()
class PoolReplica:
    """One replica: a pool of instances per env it serves, and the leases on them."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.core = FarmCore(FarmConfig.model_validate(config), owner=_owner_tag())
        self._asgi = build_app(self.core, title=f"envfarm pool {','.join(self.core.env_names())}")

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return _FullPath(self._asgi)

    # -- handle methods (``owner=`` routes them; see LeaseRouter) ------------------------------
    async def batch_call(self, items: list[dict[str, Any]], owner: str) -> list[dict[str, Any]]:
        results = await self.core.batch_call([BatchItem.model_validate(i) for i in items])
        return [r.model_dump() for r in results]

    async def create_lease(self, env: str, request: dict[str, Any] | None = None,
                           owner: str | None = None) -> dict[str, Any]:
        return self.core.create_lease(env, LeaseRequest.model_validate(request or {})
                                      ).model_dump()

    async def release(self, env: str, lease_id: str, token: str, owner: str) -> dict[str, Any]:
        return self.core.release(env, lease_id, token).model_dump()

    async def forward(self, request: ForwardedRequest, owner: str | None = None
                      ) -> ForwardedResponse:
        return await call_asgi(self._asgi, request)

    async def metrics_text(self, owner: str) -> bytes:
        return self.core.metrics.render()

    async def whoami(self, owner: str) -> dict[str, Any]:
        """Owner tag and process id of this replica (tests, operators)."""
        return {"owner": self.core.owner, "pid": os.getpid(), "leases": len(self.core.leases)}

    def record_routing_stats(self) -> dict[str, Any]:
        return {"leases": len(self.core.leases)}


@serve.ingress()
class Front:
    """The farm's front door at ``/``: catalog, health, metrics, batched calls, packed envs."""

    def __init__(self, config: dict[str, Any], deployments: dict[str, list[str]],
                 replicas: dict[str, int]) -> None:
        """``deployments``: env -> [app_name, deployment_name]; ``replicas``: app -> count."""
        self.config = FarmConfig.model_validate(config)
        self.catalog = load_catalog(self.config.catalog)
        self.routes = {env: tuple(where) for env, where in deployments.items()}
        self.replicas = replicas
        self._handles: dict[tuple[str, str], Any] = {}
        self._asgi = self._build()

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return _FullPath(self._asgi)

    def handle(self, env: str) -> Any:
        where = self.routes.get(env)
        if where is None:
            raise EnvNotFound(f"env {env!r} is not served by this farm (served: "
                              f"{', '.join(sorted(self.routes))})", env=env)
        return self.handle_for(where)

    async def batch(self, items: list[BatchItem]) -> list[BatchResult]:
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        results: list[BatchResult | None] = [None] * len(items)
        for i, item in enumerate(items):
            groups[(item.env, owner_of(item.lease_id))].append(i)

        async def one(env: str, owner: str, idx: list[int]) -> None:
            try:
                handle = self.handle(env)
            except EnvNotFound as exc:
                for i in idx:
                    results[i] = BatchResult(lease_id=items[i].lease_id, error=BatchError(
                        kind=exc.kind.value, message=exc.message, status=exc.status_code))
                return
            out = await fresh_call(handle.batch_call, [items[i].model_dump() for i in idx],
                              owner=owner)
            for i, res in zip(idx, out):
                results[i] = BatchResult.model_validate(res)

        await asyncio.gather(*(one(env, owner, idx) for (env, owner), idx in groups.items()))
        return [r for r in results if r is not None]

    def _build(self) -> FastAPI:
        app = FastAPI(title="envfarm", version="1",
                      description="The farm's front: catalog, health, metrics, batched calls.")
        install_error_handlers(app)
        served = set(self.routes)
        # /docs and /openapi.json show the whole lease API (served by the pools), not just the
        # front's own routes: the schema of the farm app over no envs.
        schema = build_app(FarmCore(self.config.with_envs([]), catalog=self.catalog)).openapi()
        app.openapi = lambda: schema  # type: ignore[method-assign]

        @app.get("/healthz")
        async def healthz() -> dict[str, Any]:
            return {"status": "ok", "envs": sorted(served)}

        @app.get("/envs", response_model=list[EnvSummary])
        async def envs() -> list[EnvSummary]:
            return [EnvSummary(name=b.name, description=b.description, tasks=len(b.tasks),
                               verified_tasks=sorted(b.code_verifiers), served=b.name in served)
                    for b in (self.catalog[n] for n in self.catalog.names)]

        @app.get("/metrics")
        async def metrics() -> Response:
            apps: dict[tuple[str, str], None] = dict.fromkeys(self.routes.values())
            calls = [fresh_call(self.handle_for(where).metrics_text, owner=f"{INDEX_PREFIX}{i}")
                     for where in apps for i in range(self.replicas.get(where[0], 1))]
            texts = await asyncio.gather(*calls, return_exceptions=True)
            body = merge_exposition([t for t in texts if isinstance(t, bytes)])
            return Response(body, media_type="text/plain; version=0.0.4")

        @app.post("/batch/call", response_model=BatchResponse)
        async def batch_call(req: BatchRequest) -> BatchResponse:
            return BatchResponse(results=await self.batch(req.calls))

        @app.api_route("/envs/{env}", methods=["GET"])
        @app.api_route("/envs/{env}/{rest:path}", methods=["GET", "POST", "DELETE"])
        async def forward(request: Request, env: str, rest: str = "") -> Response:
            # Only packed envs get here: an env with its own app matches a longer route prefix.
            try:
                handle = self.handle(env)
            except EnvNotFound as exc:
                return error_response(exc)
            fwd = ForwardedRequest(method=request.method, path=request.url.path,
                                   query_string=request.url.query.encode(),
                                   headers=list(request.scope["headers"]),
                                   body=await request.body())
            res = await fresh_call(handle.forward, fwd, owner=owner_from_path(fwd.path))
            headers = {k.decode(): v.decode() for k, v in res.headers
                       if k.lower() != b"content-length"}
            return Response(res.body, status_code=res.status, headers=headers)

        return app

    async def routes_table(self) -> dict[str, tuple[str, str]]:
        """env -> (app, deployment): how in-cluster clients find the pools."""
        return dict(self.routes)

    def handle_for(self, where: tuple[str, str]) -> Any:
        if where not in self._handles:
            self._handles[where] = serve.get_deployment_handle(where[1], app_name=where[0])
        return self._handles[where]
