"""The Ray Serve shell of the farm: deployments, owner routing, app builder, runner.

The only part of the farm that imports Ray (``envfarm/`` imports none of it: a test reads every
import).
"""

from cluster.serve._build import AppPlan, applications, plan
from cluster.serve._deployments import Front, PoolReplica
from cluster.serve._incluster import InClusterFarm
from cluster.serve._options import DeploymentOptions, ServeOptions
from cluster.serve._router import LeaseRouter, owner_from_path
from cluster.serve._run import RunningFarm, start_farm
from cluster.serve._stop import Descendants, shielded_start, stop_within

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
