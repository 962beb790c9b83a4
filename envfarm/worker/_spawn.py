"""One machinery for the front's confined processes, env workers and verifier zygotes alike:
start one (``spawn_confined``), end one (``end_confined``), say why one ended (``exit_reason``),
and the one error when one is gone (``WorkerLost``).

The process confines itself once started (``envfarm.confined.jail``); what the front does is
give it nothing to start with: an environment of its own, no descriptors but those it is
handed, a session of its own, ``/`` as its folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

#: Confined processes die with the *thread* that spawned them (the jail arms PR_SET_PDEATHSIG):
#: spawn them all from one thread that lives as long as the process, whichever thread asks.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envfarm-spawner")


class WorkerLost(Exception):
    """A confined process is gone; ``reason`` says why. ``verdict`` (env workers): for a request
    in flight then, whether its answer broke the rules (``GUILTY``), another's did (``INNOCENT``)
    or nobody can tell (``SUSPECT``: a crash, a missed deadline); None for a request sent after.
    ``kind`` (verifier processes): why the verification has no result (``judge``'s
    ``VerifierErrorKind``); None: the process crashed."""

    def __init__(self, reason: str, verdict: str | None = None, *, kind: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.verdict = verdict
        self.kind = kind


def spawn_confined(cmd: list[str], *, env: dict[str, str], pass_fds: Sequence[int] = (),
                   pipes: bool = False, stderr: bool | str = False) -> subprocess.Popen:
    """Start ``cmd``, a process that confines itself: from the spawner thread, in a session of
    its own, at ``/``, with ``env`` only and no descriptors but ``pass_fds`` and, where
    ``pipes``, a pipe on its stdin and stdout (else /dev/null); its stderr is a pipe where
    ``stderr == "pipe"``, this process's where ``stderr`` is true, else /dev/null."""
    io = subprocess.PIPE if pipes else subprocess.DEVNULL
    err = subprocess.PIPE if stderr == "pipe" else None if stderr else subprocess.DEVNULL
    return _SPAWNER.submit(
        subprocess.Popen, cmd, stdin=io, stdout=io,
        stderr=err, env=env, pass_fds=tuple(pass_fds),
        close_fds=True, start_new_session=True, cwd="/").result()


def end_confined(proc: subprocess.Popen, *, group: bool = False) -> None:
    """Kill (its whole process group where ``group``: a zygote's children too), reap, close its
    pipes."""
    if proc.poll() is None:
        try:
            if group:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except PermissionError:  # a group member of another uid: the leader at least
                    os.kill(proc.pid, signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is None:
            continue
        try:
            pipe.close()
        except OSError:
            pass


def exit_reason(code: int | None) -> str:
    """Why a process ended, from its return code (``-N``: signal N; None: it has not)."""
    if code is None:
        return "stopped answering"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else code
        if code == -signal.SIGKILL:
            return "killed by SIGKILL (memory or CPU limit, or the kernel)"
        if code == -signal.SIGXCPU:
            return "CPU time limit exceeded (SIGXCPU)"
        return f"crashed ({name})"
    return f"exited with status {code}"
