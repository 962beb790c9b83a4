"""The two Serve deployments: a pool replica (one or several envs) and the front app.

Both are thin: a pool replica is a ``FarmCore`` plus its FastAPI app; the front serves the
catalog and health, fans metrics in, runs the batched path and forwards packed envs' requests,
all through DeploymentHandles routed by ``LeaseRouter``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from typing import Any

import ray
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response
from ray import serve
from starlette.types import ASGIApp, Receive, Scope, Send

from cluster.compose import compose_core
from cluster.serve._forward import forward, to_response
from cluster.serve._direct import ReplicaListener, listener_host
from cluster.serve._handles import fresh_call
from cluster.serve._openenv import HandleLeaseAPI
from cluster.serve._router import INDEX_PREFIX
from cluster.serve._to_owner import ToOwner
from envfarm.asgi import call_asgi
from envfarm.catalog import load_catalog
from envfarm.errors import EnvfarmError, EnvNotFound, FarmNotReady
from envfarm.farm import (
    OPENENV_PATH,
    BatchError,
    BatchItem,
    BatchRequest,
    BatchResponse,
    BatchResult,
    EnvSummary,
    FarmConfig,
    FarmCore,
    FarmStatus,
    Health,
    JSONGuard,
    LeaseRequest,
    LiftRequest,
    QuarantinedTask,
    RedactCredentials,
    ReplicaStatus,
    build_app,
    error_response,
    health_response,
    install_error_handlers,
    install_quarantine_routes,
    install_status_routes,
    merge_exposition,
    merge_quarantine,
    serve_socket,
    summarize_status,
)
from envfarm.wire import ForwardedRequest, ForwardedResponse, by_owner


class _FullPath:
    """Serve strips the route prefix into root_path; the farm app routes on full paths."""

    def __init__(self, app: ASGIApp) -> None:
        self._asgi = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope.get("root_path"):
            scope = dict(scope, root_path="")
        await self._asgi(scope, receive, send)


#: Apps named so have their own route prefix (``/envs/<env>``); packed ones are reached through
#: the front (see ``cluster.serve._build.plan``).
OWN_APP_PREFIX = "env-"


def _owner_tag() -> str:
    # Replica ids are alphanumeric today; keep only safe characters in case that changes.
    return re.sub(r"[^A-Za-z0-9_]", "", serve.get_replica_context().replica_id.unique_id)


def _merged(answers: list[Any]) -> list[QuarantinedTask]:
    return merge_quarantine([[QuarantinedTask.model_validate(q) for q in a] for a in answers if isinstance(a, list)])


def _node_id() -> str:
    """The Ray node this replica runs on (the status page groups replicas by node)."""
    return ray.get_runtime_context().get_node_id()


@serve.ingress()
class PoolReplica:
    """One replica: a pool of instances per env it serves, and the leases on them."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.core = compose_core(FarmConfig.model_validate(config), owner=_owner_tag())
        # Serve's access log (--access-log) prints paths: keep MCP credentials out of it.
        logging.getLogger("ray.serve").addFilter(RedactCredentials())
        app = build_app(self.core, title=f"envfarm pool {','.join(self.core.env_names())}")
        self._drain = app.state.drain
        self._pool: Any = None
        self._asgi = ToOwner(app, self.core.owner, self._own_pool)
        self._listener = ReplicaListener(_FullPath(self._asgi),
                                         listener_host(ray.util.get_node_ip_address()))

    def _own_pool(self) -> Any:
        """This replica's own deployment, by handle (misrouted requests go on to the owner)."""
        if self._pool is None:
            ctx = serve.get_replica_context()
            self._pool = serve.get_deployment_handle(ctx.deployment, app_name=ctx.app_name)
        return self._pool

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return _FullPath(self._asgi)

    # -- handle methods (``owner=`` routes them; see LeaseRouter) ------------------------------
    async def batch_call(self, items: list[dict[str, Any]], owner: str) -> list[dict[str, Any]]:
        results = await self.core.batch_call([BatchItem.model_validate(i) for i in items])
        return [r.model_dump() for r in results]

    async def create_lease(self, env: str, request: dict[str, Any] | None = None,
                           owner: str | None = None, api_key: str | None = None
                           ) -> dict[str, Any]:
        """The Serve hop only: ``FarmCore.create_lease`` makes the lease."""
        info = await self.core.create_lease(env, LeaseRequest.model_validate(request or {}),
                                            key=api_key)
        return info.model_dump()

    async def release(self, env: str, lease_id: str, token: str, owner: str) -> dict[str, Any]:
        return self.core.release(env, lease_id, token).model_dump()

    async def forward(self, request: ForwardedRequest, owner: str | None = None
                      ) -> ForwardedResponse:
        status, headers, body = await call_asgi(self._asgi, request.method, request.path,
                                                request.query_string, request.headers,
                                                request.body)
        return ForwardedResponse(status=status, headers=headers, body=body)

    async def listener(self, owner: str) -> dict[str, Any]:
        """This replica's own HTTP listener (opened on first ask): where the Door sends the
        requests of leases this replica owns (cluster.serve._direct)."""
        return {"owner": self.core.owner, "url": self._listener.open()}

    async def metrics_text(self, owner: str) -> bytes:
        return self.core.metrics.render()

    async def replica_status(self, owner: str) -> dict[str, Any]:
        """This replica's part of the status page (the front merges them)."""
        app = serve.get_replica_context().app_name
        return self.core.replica_status(app).model_copy(update={"node": _node_id()}).model_dump()

    async def quarantined(self, owner: str) -> list[dict[str, Any]]:
        return [q.model_dump() for q in self.core.quarantine.listing()]

    async def lift_quarantine(self, owner: str, env: str, task_idx: int | None,
                              api_key: str | None = None) -> list[dict[str, Any]]:
        self.core.tenants.identify(api_key)
        return [q.model_dump() for q in self.core.quarantine.lift(self.core.served_name(env), task_idx)]

    async def drain(self, owner: str, timeout_s: float = 3.0) -> int:
        """Refuse new requests (503) and wait for those in flight: the farm is stopping."""
        return await self._drain.drain(timeout_s)

    async def whoami(self, owner: str) -> dict[str, Any]:
        """Owner tag and process id of this replica (tests, operators)."""
        return {"owner": self.core.owner, "pid": os.getpid(), "leases": len(self.core.leases),
                "handed_on": self._asgi.handed_on, "node": _node_id()}

    def record_routing_stats(self) -> dict[str, Any]:
        return {"leases": len(self.core.leases)}


@serve.ingress()
class Front:
    """The farm's front door at ``/``: catalog, health, metrics, batched calls, packed envs."""

    def __init__(self, config: dict[str, Any], deployments: dict[str, list[str]],
                 replicas: dict[str, int]) -> None:
        """``deployments``: env -> [app_name, deployment_name]; ``replicas``: app -> count."""
        self.config = FarmConfig.model_validate(config)
        self.catalog = load_catalog(self.config.catalog, check_code=False)
        self.routes = {env: tuple(where) for env, where in deployments.items()}
        self.replicas = replicas
        self._handles: dict[tuple[str, str], Any] = {}
        self._health: tuple[float, Health] | None = None
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
        async def send(env: str, owner: str, group: list[BatchItem]) -> list[BatchResult]:
            try:
                handle = self.handle(env)
            except EnvNotFound as exc:
                return [BatchResult(lease_id=i.lease_id, error=BatchError.of(exc)) for i in group]
            out = await fresh_call(handle.batch_call, [i.model_dump() for i in group],
                                   owner=owner)
            return [BatchResult.model_validate(res) for res in out]

        return await by_owner(items, lambda i: (i.env, i.lease_id), send)

    def _build(self) -> FastAPI:
        app = FastAPI(title="envfarm", version="1",
                      description="The farm's front: catalog, health, metrics, batched calls.")
        install_error_handlers(app)
        app.add_middleware(JSONGuard)
        served = set(self.routes)
        # /docs and /openapi.json show the whole lease API (served by the pools), not just the
        # front's own routes: the schema of the farm app over no envs.
        schema = build_app(FarmCore(self.config.with_envs([]), catalog=self.catalog)).openapi()
        app.openapi = lambda: schema  # type: ignore[method-assign]

        @app.get("/healthz", response_model=Health,
                 responses={503: {"model": Health, "description": "Not ready yet."}})
        async def healthz() -> Response:
            return health_response(await self.health())

        @app.get("/envs", response_model=list[EnvSummary])
        async def envs() -> list[EnvSummary]:
            return [EnvSummary.of(b, served=b.name in served)
                    for b in (self.catalog[n] for n in self.catalog.names)]

        @app.get("/metrics")
        async def metrics() -> Response:
            texts = await self.on_every_replica("metrics_text")
            body = merge_exposition([t for t in texts if isinstance(t, bytes)])
            return Response(body, media_type="text/plain; version=0.0.4")

        async def status() -> FarmStatus:
            answers = await self.on_every_replica("replica_status")
            replicas = {r.owner: r for r in (ReplicaStatus.model_validate(a) for a in answers
                                             if isinstance(a, dict))}
            return summarize_status(list(replicas.values()), sorted(served), "serve",
                                    unreachable=sum(isinstance(a, BaseException)
                                                    for a in answers),
                                    open_farm=not self.config.tenants.require_key,
                                    ready=(await self.health()).ready)

        install_status_routes(app, status)

        install_quarantine_routes(app, self.quarantined, self.lift_quarantine)
        openenv = HandleLeaseAPI(self.catalog, served, self.config.tenants, self.handle)

        @app.websocket(OPENENV_PATH)
        async def openenv_socket(websocket: WebSocket) -> None:
            await serve_socket(websocket, openenv)

        @app.post("/batch/call", response_model=BatchResponse)
        async def batch_call(req: BatchRequest) -> BatchResponse:
            return BatchResponse(results=await self.batch(req.calls))

        @app.api_route("/envs/{env}", methods=["GET"])
        @app.api_route("/envs/{env}/{rest:path}", methods=["GET", "POST", "DELETE"])
        async def to_packed_env(request: Request, env: str, rest: str = "") -> Response:
            # Only packed envs get here once the farm is up: an env with its own app matches a
            # longer route prefix, except while that app is not routable yet.
            try:
                handle = self.handle(env)
            except EnvNotFound as exc:
                return error_response(exc)
            if self.routes[env][0].startswith(OWN_APP_PREFIX):
                return error_response(FarmNotReady(
                    f"env {env!r} is starting: not routable yet; retry", env=env,
                    retry_after_s=1.0))
            fwd = ForwardedRequest.of_scope(request.scope, await request.body())
            return to_response(await forward(handle, fwd))

        return app

    async def health(self) -> Health:
        """Ready when every env's app runs and answers with warm instances (cached 1 s)."""
        now = time.monotonic()
        if self._health is not None and now - self._health[0] < 1.0:
            return self._health[1]
        apps = (await asyncio.to_thread(serve.status)).applications
        waiting = [f"app {name}: {apps[name].status if name in apps else 'not deployed'}"
                   for name in sorted({where[0] for where in self.routes.values()})
                   if name not in apps or apps[name].status != "RUNNING"]
        answers: list[Any] = []
        if not waiting:
            try:
                answers = await asyncio.wait_for(self.on_every_replica("replica_status"), 5)
            except TimeoutError:
                waiting.append("pool replicas did not answer within 5 s")
        replicas = [ReplicaStatus.model_validate(a) for a in answers if isinstance(a, dict)]
        warm = {p.env for r in replicas for p in r.pools}  # a replica answers once filled
        if replicas or not waiting:
            waiting += [f"{env}: no warm instance" for env in sorted(self.routes)
                        if env not in warm]
        health = Health(status="ok" if not waiting else "starting", ready=not waiting,
                        waiting_for=waiting, owner="front", envs=sorted(self.routes),
                        leases_active=sum(r.leases for r in replicas),
                        free_instances=sum(p.free for r in replicas for p in r.pools))
        self._health = (now, health)
        return health

    async def on_every_replica(self, method: str, **kwargs: Any) -> list[Any]:
        """Call a method on every pool replica (by index, up to each app's replica count;
        an app with fewer running gets some twice): answers, or the exceptions raised."""
        apps: dict[tuple[str, str], None] = dict.fromkeys(self.routes.values())
        calls = [fresh_call(getattr(self.handle_for(where), method),
                            owner=f"{INDEX_PREFIX}{i}", **kwargs)
                 for where in apps for i in range(self.replicas.get(where[0], 1))]
        return await asyncio.gather(*calls, return_exceptions=True)

    async def quarantined(self) -> list[QuarantinedTask]:
        """Every replica's quarantined tasks, merged (each counts its own leases)."""
        return _merged(await self.on_every_replica("quarantined"))

    async def lift_quarantine(self, req: LiftRequest, key: str | None) -> list[QuarantinedTask]:
        """Lift on every replica that serves the env; what was lifted."""
        answers = await self.on_every_replica("lift_quarantine", env=req.env, task_idx=req.task_idx, api_key=key)
        if not any(isinstance(a, list) for a in answers):
            raise next((a for a in answers if isinstance(a, EnvfarmError)), EnvNotFound(f"no replica serves {req.env!r}"))
        return _merged(answers)

    async def drain(self, timeout_s: float = 3.0) -> int:
        """Drain every pool replica at once (before Serve shuts down); requests still in
        flight at the end (a replica that did not answer counts 1)."""
        answers = await asyncio.gather(*(
            fresh_call(self.handle_for(where).drain, owner=f"{INDEX_PREFIX}{i}",
                       timeout_s=timeout_s)
            for where in dict.fromkeys(self.routes.values())
            for i in range(self.replicas.get(where[0], 1))), return_exceptions=True)
        return sum(a if isinstance(a, int) else 1 for a in answers)

    async def routes_table(self) -> dict[str, tuple[str, str]]:
        """env -> (app, deployment): how in-cluster clients find the pools."""
        return dict(self.routes)

    def handle_for(self, where: tuple[str, str]) -> Any:
        if where not in self._handles:
            self._handles[where] = serve.get_deployment_handle(where[1], app_name=where[0])
        return self._handles[where]
