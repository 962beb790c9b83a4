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


class _Handlers:
    """The lease API's handlers over one core; ``build_app`` places them at their routes."""

    def __init__(self, core: FarmCore) -> None:
        self.core = core

    def _lease(self, request: Request, env: str, lease_id: str) -> LeaseRecord:
        return self.core.lease(env, lease_id, bearer(request))

    def _base_url(self, request: Request) -> str:
        """Where this client reached the farm: the prefix of a lease's absolute mcp_url."""
        return self.core.config.public_url or str(request.base_url)

    # -- the farm ------------------------------------------------------------------------------
    async def healthz(self) -> Response:
        return health_response(self.core.health())

    async def metrics(self) -> Response:
        return Response(self.core.metrics.render(), media_type="text/plain; version=0.0.4")

    async def status(self) -> FarmStatus:
        core = self.core
        return summarize_status([core.replica_status()], core.env_names(), "no-ray",
                                open_farm=core.tenants.open, ready=core.health().ready)

    # -- the catalog ---------------------------------------------------------------------------
    async def list_envs(self) -> list[EnvSummary]:
        return self.core.summaries()

    async def get_env(self, env: EnvName) -> EnvDetail:
        return self.core.detail(env)

    async def warm_env(self, request: Request, env: EnvName) -> EnvDetail:
        """Load the env now (on-demand farms): its first lease then skips the cold start.
        Takes the farm API key of lease creation (a cold start costs a worker)."""
        return await self.core.warm(env, request.headers.get(KEY_HEADER))

    # -- leases --------------------------------------------------------------------------------
    async def create_lease(self, request: Request, env: EnvName,
                           req: Annotated[LeaseRequest | None, Body()] = None) -> LeaseInfo:
        """The HTTP route only: ``FarmCore.create_lease`` makes the lease."""
        return await self.core.create_lease(env, req or LeaseRequest(), self._base_url(request),
                                            request.headers.get(KEY_HEADER))

    async def create_leases(self, request: Request, env: EnvName, req: LeaseBatchRequest
                            ) -> list[LeaseInfo]:
        body = LeaseRequest.model_validate(req.model_dump(exclude={"count"}))
        return await self.core.create_leases(env, body, req.count, self._base_url(request),
                                             request.headers.get(KEY_HEADER))

    async def tools(self, request: Request, env: EnvName, lease_id: LeaseId,
                    rendering: Annotated[Rendering, Query(alias="as")] = Rendering.exact
                    ) -> list[ToolSpec]:
        """The lease's tools: their exact schemas, or ``?as=mcp`` as MCP lists them (AWM's
        fastapi-mcp rendering, what the OpenEnv endpoint lists)."""
        lease = self._lease(request, env, lease_id)
        if rendering is Rendering.mcp:
            lease.agent_requests += 1
            return self.core.tool_specs[lease.env]
        return self.core.tools(lease)

    async def call(self, request: Request, env: EnvName, lease_id: LeaseId, req: CallRequest
                   ) -> CallResult:
        lease = self._lease(request, env, lease_id)
        self.core.admit_call(lease)
        return await self.core.call(lease, req.tool, req.arguments)

    async def reset(self, request: Request, env: EnvName, lease_id: LeaseId) -> ResetResponse:
        await self.core.reset(self._lease(request, env, lease_id))
        return ResetResponse(lease_id=lease_id)

    async def verify(self, request: Request, env: EnvName, lease_id: LeaseId,
                     req: Annotated[VerifyRequest | None, Body()] = None) -> VerifyResponse:
        return await self.core.verify(self._lease(request, env, lease_id), req or VerifyRequest())

    async def snapshot(self, request: Request, env: EnvName, lease_id: LeaseId,
                       which: Annotated[Which, Query()] = Which.current) -> Response:
        lease = self._lease(request, env, lease_id)
        data = (lease.instance.initial_snapshot() if which is Which.initial
                else await self.core.snapshot(lease))
        return Response(data, media_type="application/vnd.sqlite3", headers={
            "Content-Disposition": f'attachment; filename="{lease_id}-{which.value}.db"'})

    async def fork(self, request: Request, env: EnvName, lease_id: LeaseId,
                   req: Annotated[ForkRequest | None, Body()] = None) -> LeaseInfo:
        """A new lease of the same tenant and task whose database is this lease's state now
        (its steps so far kept for verification); this lease goes on untouched."""
        return await self.core.fork(self._lease(request, env, lease_id), req or ForkRequest(),
                                    self._base_url(request))

    async def release(self, request: Request, env: EnvName, lease_id: LeaseId
                      ) -> ReleaseResponse:
        return self.core.release(env, lease_id, bearer(request))

    # -- batches -------------------------------------------------------------------------------
    async def owner_batch(self, env: EnvName, owner: Owner, req: BatchRequest) -> BatchResponse:
        # Reaches the owner replica in one hop through Serve (the router reads the owner from
        # the path); items of leases owned elsewhere answer 410 one by one.
        return BatchResponse(results=await self.core.batch_call(req.calls))

    async def batch_call(self, req: BatchRequest) -> BatchResponse:
        return BatchResponse(results=await self.core.batch_call(req.calls))


def _errors(*codes: int) -> dict[int | str, dict]:
    return {k: _ERRORS[k] for k in codes}


_LEASE_ERRORS = _errors(401, 403, 404, 410, 429)
_CREATE_ERRORS = _errors(401, 403, 404, 409, 413, 422, 429, 503)

#: (method, path, handler, FastAPI route options), in the order the OpenAPI lists them.
_FARM_ROUTES: list[tuple[str, str, str, dict]] = [
    ("GET", "/healthz", "healthz", dict(
        response_model=Health, tags=["farm"],
        responses={503: {"model": Health, "description": "Not ready yet."}})),
    ("GET", "/metrics", "metrics", dict(
        tags=["farm"], response_class=Response,
        responses={200: {"content": {"text/plain": {}}}})),
]
_CATALOG_ROUTES: list[tuple[str, str, str, dict]] = [
    ("GET", "/envs", "list_envs", dict(response_model=list[EnvSummary], tags=["catalog"])),
    ("GET", "/envs/{env}", "get_env", dict(
        response_model=EnvDetail, tags=["catalog"], responses=_errors(404))),
    ("POST", "/envs/{env}/warm", "warm_env", dict(
        response_model=EnvDetail, tags=["catalog"], dependencies=_key,
        responses=_errors(401, 403, 404, 503) | {500: {"model": ErrorBody}})),
]
_LEASE_ROUTES: list[tuple[str, str, str, dict]] = [
    ("POST", "/envs/{env}/leases", "create_lease", dict(
        response_model=LeaseInfo, status_code=201, tags=["leases"], responses=_CREATE_ERRORS,
        dependencies=_key)),
    ("POST", "/envs/{env}/leases:batch", "create_leases", dict(
        response_model=list[LeaseInfo], status_code=201, tags=["leases"],
        responses=_CREATE_ERRORS, dependencies=_key)),
    ("GET", "/envs/{env}/leases/{lease_id}/tools", "tools", dict(
        response_model=list[ToolSpec], tags=["leases"], responses=_LEASE_ERRORS,
        dependencies=_auth)),
    ("POST", "/envs/{env}/leases/{lease_id}/call", "call", dict(
        response_model=CallResult, tags=["leases"],
        responses=_LEASE_ERRORS | _errors(413, 422), dependencies=_auth)),
    ("POST", "/envs/{env}/leases/{lease_id}/reset", "reset", dict(
        response_model=ResetResponse, tags=["leases"], responses=_LEASE_ERRORS,
        dependencies=_auth)),
    ("POST", "/envs/{env}/leases/{lease_id}/verify", "verify", dict(
        response_model=VerifyResponse, tags=["leases"],
        responses=_LEASE_ERRORS | _errors(422), dependencies=_auth)),
    ("GET", "/envs/{env}/leases/{lease_id}/snapshot", "snapshot", dict(
        tags=["leases"], response_class=Response, dependencies=_auth,
        responses=_LEASE_ERRORS | {200: {"content": {"application/vnd.sqlite3": {}}}})),
    ("POST", "/envs/{env}/leases/{lease_id}/fork", "fork", dict(
        response_model=LeaseInfo, status_code=201, tags=["leases"],
        responses=_LEASE_ERRORS | _errors(422, 503), dependencies=_auth)),
    ("DELETE", "/envs/{env}/leases/{lease_id}", "release", dict(
        response_model=ReleaseResponse, tags=["leases"], responses=_LEASE_ERRORS,
        dependencies=_auth)),
    ("POST", "/envs/{env}/owners/{owner}/batch", "owner_batch", dict(
        response_model=BatchResponse, tags=["batch"], responses=_errors(413, 422))),
    ("POST", "/batch/call", "batch_call", dict(
        response_model=BatchResponse, tags=["batch"], responses=_errors(413, 422))),
]
#: A lease's MCP endpoint (``LeaseMCP``, an ASGI app of its own).
_MCP_PATHS = ("/envs/{env}/leases/{lease_id}/mcp", "/envs/{env}/leases/{lease_id}/mcp/{cap}")


def _add_routes(app: FastAPI, handlers: _Handlers, routes: list[tuple[str, str, str, dict]]
                ) -> None:
    for method, path, name, options in routes:
        app.add_api_route(path, getattr(handlers, name), methods=[method], **options)


def _lifespan(core: FarmCore, mcp: LeaseMCP, manage_core: bool):
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_core:
            await core.start()
        async with mcp.lifespan():
            yield
        if manage_core:
            await core.aclose()

    return lifespan


def _install_middleware(app: FastAPI, core: FarmCore, mcp: LeaseMCP) -> None:
    """From the outside in: a stop's drain, the body limit, hostile JSON, the fast paths."""
    if core.config.fast_paths:
        app.add_middleware(FastCall, core=core, mcp=mcp)  # inside BodyLimit: 413 for big bodies
    app.add_middleware(JSONGuard)  # hostile JSON: 400 before any route parses it
    app.add_middleware(BodyLimit, limit=core.config.max_body_bytes)
    app.state.drain = Drain()  # a stop waits for requests in flight (PoolReplica.drain)
    app.add_middleware(Draining, state=app.state.drain)


def build_app(core: FarmCore, *, title: str = "envfarm", manage_core: bool = True) -> FastAPI:
    """The farm's HTTP app. ``manage_core`` starts/stops the core with the app's lifespan."""
    mcp = LeaseMCP(core, fast_path=core.config.fast_paths)
    app = FastAPI(title=title, version="1", lifespan=_lifespan(core, mcp, manage_core),
                  description="Lease isolated tool-use environments; see docs/lease-api.md "
                              "and docs/architecture.md in the envfarm repository.")
    install_error_handlers(app)
    _install_middleware(app, core, mcp)
    app.state.core = core
    app.state.mcp = mcp
    handlers = _Handlers(core)
    _add_routes(app, handlers, _FARM_ROUTES)
    install_status_routes(app, handlers.status)
    _add_routes(app, handlers, _CATALOG_ROUTES)
    _quarantine_routes(app, core)
    _add_routes(app, handlers, _LEASE_ROUTES)
    for path in _MCP_PATHS:
        app.router.routes.append(Route(path, mcp, methods=["GET", "POST", "DELETE"]))
    install_socket(app, core)
    return app
