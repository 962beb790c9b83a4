"""The front's handles on env workers, the processes where generated env code runs.

The front (a Serve pool replica, or the ``--no-ray`` process) holds tokens, client sockets,
the lease table and verdicts, and never executes generated code: each env type's code runs in
worker processes it spawns (``python -m envfarm.confined``: what runs there is
``envfarm.confined``) and supervises over a framed pipe. Starting, ending and losing a confined
process is one machinery (``spawn_confined``, ``end_confined``, ``exit_reason``, ``WorkerLost``),
the judge's verifier zygote's too.
"""

from envfarm.worker._env import WorkerEnv, WorkerOptions
from envfarm.worker._instance import InstanceClosed, RemoteInstance
from envfarm.worker._process import WorkerProcess, WorkerStartError
from envfarm.worker._spares import SpareWorkers
from envfarm.worker._spawn import WorkerLost, end_confined, exit_reason, spawn_confined

__all__ = [
    "InstanceClosed",
    "RemoteInstance",
    "SpareWorkers",
    "WorkerEnv",
    "WorkerLost",
    "WorkerOptions",
    "WorkerProcess",
    "WorkerStartError",
    "end_confined",
    "exit_reason",
    "spawn_confined",
]
