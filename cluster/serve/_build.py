"""Lay a farm out as Serve applications: one per env at ``/envs/<env>`` (or one per pack of
envs), plus the front app at ``/``."""

from __future__ import annotations

from dataclasses import dataclass

from ray import serve
from ray.serve import Deployment
from ray.serve.api import RunTarget

from cluster.serve._deployments import OWN_APP_PREFIX, Front
from cluster.serve._ingress import pool_application
from cluster.serve._options import DeploymentOptions, ServeOptions, access_logging
from envfarm.catalog import Catalog, load_catalog
from envfarm.farm import FarmConfig

FRONT_APP = "envfarm"


@dataclass
class AppPlan:
    """One Serve application of the farm."""

    name: str
    envs: list[str]
    route_prefix: str | None  # None: reached through the front app only (packed envs)
    options: DeploymentOptions

    @property
    def deployment(self) -> str:
        return "pool"


def plan(config: FarmConfig, options: ServeOptions, catalog: Catalog | None = None
         ) -> list[AppPlan]:
    """Which envs go to which application (pure: no Ray needed)."""
    catalog = catalog or load_catalog(config.catalog, check_code=False)
    envs = config.envs if config.envs is not None else catalog.servable
    envs = [catalog[e].name for e in envs]
    if options.pack == 1 and config.loads_on_demand(len(envs)):
        # Many types load on demand: their code lives in workers, so one deployment holds
        # them all (a Serve application per type costs ~84 MiB and 1-2 s to start).
        return [AppPlan(name="pack-0", envs=envs, route_prefix=None, options=options.deployment)]
    if options.pack == 1:
        return [AppPlan(name=f"{OWN_APP_PREFIX}{e}", envs=[e], route_prefix=f"/envs/{e}",
                        options=options.for_env(e)) for e in envs]
    packs = [envs[i:i + options.pack] for i in range(0, len(envs), options.pack)]
    return [AppPlan(name=f"pack-{k}", envs=p, route_prefix=None, options=options.deployment)
            for k, p in enumerate(packs)]


def front_deployment(replicas: int | None = None, access_log: bool = False) -> Deployment:
    """The front deployment (catalog, health, metrics, batch, packed envs)."""
    extra = {} if replicas is None else {"num_replicas": replicas}
    return serve.deployment(Front, name="front", max_ongoing_requests=1024,
                            ray_actor_options={"num_cpus": 0},
                            logging_config=access_logging(access_log), **extra)


def routes_of(plans: list[AppPlan]) -> tuple[dict[str, list[str]], dict[str, int]]:
    """What the front needs to find the pools: env -> [app, deployment], app -> replicas."""
    return ({e: [p.name, p.deployment] for p in plans for e in p.envs},
            {p.name: max_replicas(p.options) for p in plans})


def applications(config: FarmConfig, options: ServeOptions, plans: list[AppPlan]
                 ) -> list[RunTarget]:
    """Serve RunTargets for the plan, front app last (it needs the others' names)."""
    targets = []
    for p in plans:
        app = pool_application(config.with_envs(p.envs).model_dump(), p.options, options.proxy)
        targets.append(RunTarget(target=app, name=p.name, route_prefix=p.route_prefix))
    routes, replicas = routes_of(plans)
    front = front_deployment(options.front_replicas, options.deployment.access_log)
    targets.append(RunTarget(target=front.bind(config.model_dump(), routes, replicas),
                             name=FRONT_APP, route_prefix="/"))
    return targets


def max_replicas(options: DeploymentOptions) -> int:
    if options.autoscaling_config:
        return int(options.autoscaling_config.get("max_replicas", options.num_replicas))
    return options.num_replicas
