"""Env workers: the processes where generated env code runs, and the front's handle on them.

The front (a Serve pool replica, or the ``--no-ray`` process) holds tokens, client sockets,
the lease table and verdicts, and never executes generated code: each env type's code runs in
worker processes it spawns, confines (``envfarm.jail``) and supervises over a framed pipe.
"""

from envfarm.worker._env import WorkerEnv, WorkerOptions
from envfarm.worker._instance import InstanceClosed, RemoteInstance
from envfarm.worker._process import WorkerLost, WorkerProcess, WorkerStartError
from envfarm.worker._spares import SpareWorkers

__all__ = [
    "InstanceClosed",
    "RemoteInstance",
    "SpareWorkers",
    "WorkerEnv",
    "WorkerLost",
    "WorkerOptions",
    "WorkerProcess",
    "WorkerStartError",
]
