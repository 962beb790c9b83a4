"""Serve application builders for config-file deploys (``serve deploy``, KubeRay RayService).

``import_path: cluster.serve.apps:pool_app`` with ``args`` as in ``PoolAppArgs``; the front app
likewise with ``FrontAppArgs``. ``serve_config()`` writes the whole farm as a Serve config.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from ray.serve import Application

from cluster.serve._build import FRONT_APP, front_deployment, plan, routes_of
from cluster.serve._ingress import current_proxy, pool_application
from cluster.serve._options import DeploymentOptions, ServeOptions
from envfarm.catalog import load_catalog
from envfarm.errors import ConfigError
from envfarm.farm import (
    KEYS_ENV,
    TENANTS_ENV,
    FarmConfig,
    is_loopback,
    with_environ_tenants,
)


class PoolAppArgs(BaseModel):
    """``args`` of a pool application: the farm config for the envs it serves."""

    model_config = ConfigDict(extra="forbid")

    farm: FarmConfig = Field(description="Catalog, envs, pool sizes, lease policy.")
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)


class FrontAppArgs(BaseModel):
    """``args`` of the front application."""

    model_config = ConfigDict(extra="forbid")

    farm: FarmConfig
    routes: dict[str, list[str]] = Field(description="env -> [app name, deployment name].")
    replicas: dict[str, int] = Field(default_factory=dict, description="app -> replicas.")
    access_log: bool = Field(default=False, description="Serve's access log on the front.")


def pool_app(args: dict[str, Any]) -> Application:
    a = PoolAppArgs.model_validate(args)
    # Built in the cluster: its environment says which ingress Serve runs and who may lease
    # (k8s/, cluster/).
    return pool_application(_with_tenants(a.farm).model_dump(), a.deployment, current_proxy())


def front_app(args: dict[str, Any]) -> Application:
    a = FrontAppArgs.model_validate(args)
    return front_deployment(access_log=a.access_log).bind(_with_tenants(a.farm).model_dump(),
                                                          a.routes, a.replicas)


def _with_tenants(farm: FarmConfig) -> FarmConfig:
    """The farm's tenants plus the pod's (``$ENVFARM_API_KEYS`` from a Secret,
    ``$ENVFARM_TENANTS``); a farm that needs keys and has none refuses to deploy."""
    tenants = with_environ_tenants(farm.tenants)
    if tenants.require_key and not tenants.tenants:
        raise ConfigError(f"the farm listens beyond loopback and no tenant may lease: set "
                          f"${KEYS_ENV} (NAME:KEY,...) or ${TENANTS_ENV} (a tenants file) in the "
                          f"pods' environment, e.g. from a Secret (k8s/README.md)")
    return farm.model_copy(update={"tenants": tenants})


def serve_config(config: FarmConfig, options: ServeOptions) -> dict[str, Any]:
    """The farm as a Serve config file (the ``serveConfigV2`` of a RayService). Listening
    beyond loopback, lease creation needs a tenant's key (the pods' environment gives them)."""
    if not is_loopback(options.host):
        config = config.model_copy(update={"tenants": config.tenants.model_copy(
            update={"require_key": True})})
    plans = plan(config, options, load_catalog(config.catalog, check_code=False))
    apps: list[dict[str, Any]] = []
    for p in plans:
        app: dict[str, Any] = {
            "name": p.name, "import_path": "cluster.serve.apps:pool_app",
            "args": PoolAppArgs(farm=config.with_envs(p.envs),
                                deployment=p.options).model_dump(mode="json",
                                                                 exclude_defaults=True)}
        if p.route_prefix:
            app["route_prefix"] = p.route_prefix
        apps.append(app)
    routes, replicas = routes_of(plans)
    front = FrontAppArgs(farm=config, routes=routes, replicas=replicas,
                         access_log=options.deployment.access_log)
    apps.append({"name": FRONT_APP, "route_prefix": "/", "import_path":
                 "cluster.serve.apps:front_app",
                 "args": front.model_dump(mode="json", exclude_defaults=True)})
    return {"http_options": {"host": options.host, "port": options.port},
            "applications": apps}
