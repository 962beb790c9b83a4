"""The in-cluster path: a trainer inside the Ray cluster drives leases through DeploymentHandles,
skipping Serve's HTTP proxy (the bottleneck on small machines)."""

from __future__ import annotations

from typing import Any

from ray import serve

from cluster.serve._build import FRONT_APP
from cluster.serve._handles import fresh_call
from envfarm.errors import EnvfarmError, EnvNotFound, error_from_body
from envfarm.models import CallResult
from envfarm.wire import BatchResult, LeaseInfo, ReleaseResponse, by_owner, owner_of


class InClusterFarm:
    """Leases and calls over DeploymentHandles, owner-routed like HTTP requests."""

    def __init__(self, routes: dict[str, tuple[str, str]], api_key: str | None = None) -> None:
        """``api_key``: the tenant's farm API key, where the farm requires one."""
        self.routes = routes
        self.api_key = api_key
        self._handles: dict[tuple[str, str], Any] = {}

    @classmethod
    async def connect(cls, api_key: str | None = None) -> InClusterFarm:
        """Ask the running farm's front app where every env's pool lives."""
        front = serve.get_deployment_handle("front", app_name=FRONT_APP)
        routes = await fresh_call(front.routes_table)
        return cls({env: (where[0], where[1]) for env, where in routes.items()}, api_key)

    def _handle(self, env: str) -> Any:
        where = self.routes.get(env)
        if where is None:
            raise EnvNotFound(f"env {env!r} is not served by this farm", env=env)
        if where not in self._handles:
            self._handles[where] = serve.get_deployment_handle(where[1], app_name=where[0])
        return self._handles[where]

    async def lease(self, env: str, **request: Any) -> LeaseInfo:
        data = await fresh_call(self._handle(env).create_lease, env, request, owner=None,
                                api_key=self.api_key)
        return LeaseInfo.model_validate(data)

    async def release(self, lease: LeaseInfo) -> ReleaseResponse:
        data = await fresh_call(self._handle(lease.env).release, lease.env, lease.lease_id,
                            lease.token, owner=owner_of(lease.lease_id))
        return ReleaseResponse.model_validate(data)

    async def call_many(self, calls: list[tuple[LeaseInfo, str, dict[str, Any]]]
                        ) -> list[BatchResult]:
        """Many leases' calls: one handle request per owner replica, run concurrently."""
        async def send(env: str, owner: str, group: list[tuple[LeaseInfo, str, dict[str, Any]]]
                       ) -> list[BatchResult]:
            items = [{"env": env, "lease_id": lease.lease_id, "token": lease.token,
                      "tool": tool, "arguments": arguments} for lease, tool, arguments in group]
            out = await fresh_call(self._handle(env).batch_call, items, owner=owner)
            return [BatchResult.model_validate(res) for res in out]

        return await by_owner(calls, lambda c: (c[0].env, c[0].lease_id), send)

    async def call(self, lease: LeaseInfo, tool: str, arguments: dict[str, Any] | None = None
                   ) -> CallResult:
        (res,) = await self.call_many([(lease, tool, arguments or {})])
        if res.result is None:
            err = res.error
            raise (error_from_body(err.status, {**err.model_dump(exclude={"status"}),
                                                "lease_id": lease.lease_id})
                   if err else EnvfarmError("call failed", lease_id=lease.lease_id))
        return res.result
