"""The Ray Serve shell of the farm: deployments, owner routing, app builder, runner.

The only part of envfarm that imports Ray.
"""

from envfarm.serve._build import AppPlan, applications, plan
from envfarm.serve._deployments import Front, PoolReplica
from envfarm.serve._incluster import InClusterFarm
from envfarm.serve._options import DeploymentOptions, ServeOptions
from envfarm.serve._router import LeaseRouter, owner_from_path
from envfarm.serve._run import RunningFarm, start_farm
from envfarm.serve._stop import Descendants, shielded_start, stop_within

__all__ = [
    "AppPlan",
    "DeploymentOptions",
    "Descendants",
    "Front",
    "InClusterFarm",
    "LeaseRouter",
    "PoolReplica",
    "RunningFarm",
    "ServeOptions",
    "applications",
    "owner_from_path",
    "plan",
    "shielded_start",
    "start_farm",
    "stop_within",
]
