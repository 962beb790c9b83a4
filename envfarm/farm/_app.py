"""The lease API as a FastAPI app over one ``FarmCore`` (``--no-ray`` and inside Serve replicas)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import Enum
from typing import Annotated

from fastapi import Body, Depends, FastAPI, Path, Query, Request
from fastapi.responses import Response
from fastapi.security import APIKeyHeader, HTTPBearer
from starlette.routing import Route

from envfarm.farm._core import FarmCore
from envfarm.farm._fastpath import FastCall
from envfarm.farm._http import (
    BodyLimit,
    Drain,
    Draining,
    bearer,
    health_response,
    install_error_handlers,
)
from envfarm.farm._json_guard import JSONGuard
from envfarm.farm._lease import LeaseRecord
from envfarm.farm._mcp import LeaseMCP
from envfarm.farm._openenv import install_socket
from envfarm.farm._quarantine import install_quarantine_routes
from envfarm.farm._status import FarmStatus, install_status_routes, summarize_status
from envfarm.farm._tenants import KEY_HEADER
from envfarm.models import CallResult, ToolSpec
from envfarm.wire import (
    LEASE_ID_PATTERN,
    OWNER_PATTERN,
    BatchRequest,
    BatchResponse,
    CallRequest,
    EnvDetail,
    EnvSummary,
    ErrorBody,
    ForkRequest,
    Health,
    LeaseBatchRequest,
    LeaseInfo,
    LeaseRequest,
    LiftRequest,
    QuarantinedTask,
    ReleaseResponse,
    ResetResponse,
    VerifyRequest,
    VerifyResponse,
)

EnvName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$",
                               description="AWM-normalized env name.")]
LeaseId = Annotated[str, Path(min_length=3, max_length=100, pattern=LEASE_ID_PATTERN,
                              description="Lease id (<owner>-<random>).")]

Owner = Annotated[str, Path(min_length=1, max_length=64, pattern=OWNER_PATTERN,
                            description="Owner tag: the part of a lease id before '-'.")]

_ERRORS = {s: {"model": ErrorBody} for s in (401, 403, 404, 409, 410, 413, 422, 429, 503)}
# Declares the bearer scheme in the OpenAPI; the token itself is read by ``bearer()`` so that
# a missing one becomes our 401 body, not FastAPI's.
_auth = [Depends(HTTPBearer(auto_error=False, description="The lease's token."))]
# The farm API key of lease creation, read by the handler (a missing one may be fine).
_key = [Depends(APIKeyHeader(name="X-Envfarm-Key", auto_error=False,
                             description="A tenant's farm API key."))]


class Which(str, Enum):
    current = "current"
    initial = "initial"


class Rendering(str, Enum):
    exact = "exact"
    mcp = "mcp"


def _quarantine_routes(app: FastAPI, core: FarmCore) -> None:
    async def quarantined() -> list[QuarantinedTask]:
        return core.quarantine.listing()

    async def lift(req: LiftRequest, key: str | None) -> list[QuarantinedTask]:
        core.tenants.identify(key)  # a lift takes the farm API key of lease creation
        return core.quarantine.lift(core.served_name(req.env), req.task_idx)

    install_quarantine_routes(app, quarantined, lift)


def build_app(core: FarmCore, *, title: str = "envfarm", manage_core: bool = True) -> FastAPI:
    """The farm's HTTP app. ``manage_core`` starts/stops the core with the app's lifespan."""
    mcp = LeaseMCP(core, fast_path=core.config.fast_paths)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_core:
            await core.start()
        async with mcp.lifespan():
            yield
        if manage_core:
            await core.aclose()

    app = FastAPI(title=title, version="1", lifespan=lifespan,
                  description="Lease isolated tool-use environments; see docs/lease-api.md "
                              "and docs/architecture.md in the envfarm repository.")
    install_error_handlers(app)
    if core.config.fast_paths:
        app.add_middleware(FastCall, core=core, mcp=mcp)  # inside BodyLimit: 413 for big bodies
    app.add_middleware(JSONGuard)  # hostile JSON: 400 before any route parses it
    app.add_middleware(BodyLimit, limit=core.config.max_body_bytes)
    app.state.drain = Drain()  # a stop waits for requests in flight (PoolReplica.drain)
    app.add_middleware(Draining, state=app.state.drain)
    app.state.core = core
    app.state.mcp = mcp

    def lease_of(request: Request, env: str, lease_id: str) -> LeaseRecord:
        return core.lease(env, lease_id, bearer(request))

    def base_url(request: Request) -> str:
        """Where this client reached the farm: the prefix of a lease's absolute mcp_url."""
        return core.config.public_url or str(request.base_url)

    @app.get("/healthz", response_model=Health, tags=["farm"],
             responses={503: {"model": Health, "description": "Not ready yet."}})
    async def healthz() -> Response:
        return health_response(core.health())

    @app.get("/metrics", tags=["farm"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def metrics() -> Response:
        return Response(core.metrics.render(), media_type="text/plain; version=0.0.4")

    async def status() -> FarmStatus:
        return summarize_status([core.replica_status()], core.env_names(), "no-ray",
                                open_farm=core.tenants.open, ready=core.health().ready)

    install_status_routes(app, status)

    @app.get("/envs", response_model=list[EnvSummary], tags=["catalog"])
    async def list_envs() -> list[EnvSummary]:
        return core.summaries()

    @app.get("/envs/{env}", response_model=EnvDetail, tags=["catalog"],
             responses={404: _ERRORS[404]})
    async def get_env(env: EnvName) -> EnvDetail:
        return core.detail(env)

    @app.post("/envs/{env}/warm", response_model=EnvDetail, tags=["catalog"],
              responses={k: _ERRORS[k] for k in (401, 403, 404, 503)}
              | {500: {"model": ErrorBody}}, dependencies=_key)
    async def warm_env(request: Request, env: EnvName) -> EnvDetail:
        """Load the env now (on-demand farms): its first lease then skips the cold start.
        Takes the farm API key of lease creation (a cold start costs a worker)."""
        return await core.warm(env, request.headers.get(KEY_HEADER))

    _quarantine_routes(app, core)

    create_errors = {k: _ERRORS[k] for k in (401, 403, 404, 409, 413, 422, 429, 503)}

    @app.post("/envs/{env}/leases", response_model=LeaseInfo, status_code=201, tags=["leases"],
              responses=create_errors, dependencies=_key)
    async def create_lease(request: Request, env: EnvName,
                           req: Annotated[LeaseRequest | None, Body()] = None) -> LeaseInfo:
        return await core.create_lease(env, req or LeaseRequest(), base_url(request),
                                       request.headers.get(KEY_HEADER))

    @app.post("/envs/{env}/leases:batch", response_model=list[LeaseInfo], status_code=201,
              tags=["leases"], responses=create_errors, dependencies=_key)
    async def create_leases(request: Request, env: EnvName, req: LeaseBatchRequest
                            ) -> list[LeaseInfo]:
        body = LeaseRequest.model_validate(req.model_dump(exclude={"count"}))
        return await core.create_leases(env, body, req.count, base_url(request),
                                        request.headers.get(KEY_HEADER))

    lease_errors = {k: _ERRORS[k] for k in (401, 403, 404, 410, 429)}

    @app.get("/envs/{env}/leases/{lease_id}/tools", response_model=list[ToolSpec],
             tags=["leases"], responses=lease_errors, dependencies=_auth)
    async def tools(request: Request, env: EnvName, lease_id: LeaseId,
                    rendering: Annotated[Rendering, Query(alias="as")] = Rendering.exact
                    ) -> list[ToolSpec]:
        """The lease's tools: their exact schemas, or ``?as=mcp`` as MCP lists them (AWM's
        fastapi-mcp rendering, what the OpenEnv endpoint lists)."""
        lease = lease_of(request, env, lease_id)
        if rendering is Rendering.mcp:
            lease.agent_requests += 1
            return core.tool_specs[lease.env]
        return core.tools(lease)

    @app.post("/envs/{env}/leases/{lease_id}/call", response_model=CallResult, tags=["leases"],
              responses=lease_errors | {k: _ERRORS[k] for k in (413, 422)},
              dependencies=_auth)
    async def call(request: Request, env: EnvName, lease_id: LeaseId, req: CallRequest
                   ) -> CallResult:
        lease = lease_of(request, env, lease_id)
        core.admit_call(lease)
        return await core.call(lease, req.tool, req.arguments)

    @app.post("/envs/{env}/leases/{lease_id}/reset", response_model=ResetResponse,
              tags=["leases"], responses=lease_errors, dependencies=_auth)
    async def reset(request: Request, env: EnvName, lease_id: LeaseId) -> ResetResponse:
        await core.reset(lease_of(request, env, lease_id))
        return ResetResponse(lease_id=lease_id)

    @app.post("/envs/{env}/leases/{lease_id}/verify", response_model=VerifyResponse,
              tags=["leases"], responses=lease_errors | {422: _ERRORS[422]}, dependencies=_auth)
    async def verify(request: Request, env: EnvName, lease_id: LeaseId,
                     req: Annotated[VerifyRequest | None, Body()] = None) -> VerifyResponse:
        return await core.verify(lease_of(request, env, lease_id), req or VerifyRequest())

    @app.get("/envs/{env}/leases/{lease_id}/snapshot", tags=["leases"], response_class=Response,
             responses=lease_errors | {200: {"content": {"application/vnd.sqlite3": {}}}},
             dependencies=_auth)
    async def snapshot(request: Request, env: EnvName, lease_id: LeaseId,
                       which: Annotated[Which, Query()] = Which.current) -> Response:
        lease = lease_of(request, env, lease_id)
        data = (lease.instance.initial_snapshot() if which is Which.initial
                else await core.snapshot(lease))
        return Response(data, media_type="application/vnd.sqlite3", headers={
            "Content-Disposition": f'attachment; filename="{lease_id}-{which.value}.db"'})

    @app.post("/envs/{env}/leases/{lease_id}/fork", response_model=LeaseInfo, status_code=201,
              tags=["leases"], responses=lease_errors | {k: _ERRORS[k] for k in (422, 503)},
              dependencies=_auth)
    async def fork(request: Request, env: EnvName, lease_id: LeaseId,
                   req: Annotated[ForkRequest | None, Body()] = None) -> LeaseInfo:
        """A new lease of the same tenant and task whose database is this lease's state now
        (its steps so far kept for verification); this lease goes on untouched."""
        return await core.fork(lease_of(request, env, lease_id), req or ForkRequest(),
                               base_url(request))

    @app.delete("/envs/{env}/leases/{lease_id}", response_model=ReleaseResponse,
                tags=["leases"], responses=lease_errors, dependencies=_auth)
    async def release(request: Request, env: EnvName, lease_id: LeaseId) -> ReleaseResponse:
        return core.release(env, lease_id, bearer(request))

    @app.post("/envs/{env}/owners/{owner}/batch", response_model=BatchResponse, tags=["batch"],
              responses={k: _ERRORS[k] for k in (413, 422)})
    async def owner_batch(env: EnvName, owner: Owner, req: BatchRequest) -> BatchResponse:
        # Reaches the owner replica in one hop through Serve (the router reads the owner from
        # the path); items of leases owned elsewhere answer 410 one by one.
        return BatchResponse(results=await core.batch_call(req.calls))

    @app.post("/batch/call", response_model=BatchResponse, tags=["batch"],
              responses={k: _ERRORS[k] for k in (413, 422)})
    async def batch_call(req: BatchRequest) -> BatchResponse:
        return BatchResponse(results=await core.batch_call(req.calls))

    for path in ("/envs/{env}/leases/{lease_id}/mcp", "/envs/{env}/leases/{lease_id}/mcp/{cap}"):
        app.router.routes.append(Route(path, mcp, methods=["GET", "POST", "DELETE"]))
    install_socket(app, core)
    return app
