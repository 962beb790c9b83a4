"""Start and stop the farm on an embedded local Ray (no cluster needed)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import ray
from ray import serve

from envfarm.farm import FarmConfig
from envfarm.serve._build import AppPlan, applications, plan
from envfarm.serve._options import ServeOptions


@dataclass
class RunningFarm:
    """A farm running on Serve: where it listens and what it serves."""

    url: str
    plans: list[AppPlan]
    started_ray: bool
    startup_s: float
    envs: list[str] = field(default_factory=list)

    def instances_ready(self, warm: int) -> int:
        return sum(len(p.envs) * warm * p.options.num_replicas for p in self.plans)

    def shutdown(self) -> None:
        serve.shutdown()
        if self.started_ray:
            ray.shutdown()


def start_farm(config: FarmConfig, options: ServeOptions, *, address: str | None = None
               ) -> RunningFarm:
    """Deploy every app of the farm and wait until they run. ``address``: an existing cluster."""
    started = time.perf_counter()
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # keep start-up output readable
    started_ray = False
    if not ray.is_initialized():
        if address is not None:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=options.num_cpus, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        started_ray = True
    serve.start(http_options={"host": options.host, "port": options.port},
                logging_config={"log_level": "WARNING"})
    plans = plan(config, options)
    serve.run_many(applications(config, options, plans), wait_for_applications_running=True)
    return RunningFarm(url=f"http://{options.host}:{options.port}", plans=plans,
                       started_ray=started_ray, startup_s=time.perf_counter() - started,
                       envs=[e for p in plans for e in p.envs])
