"""The verifier zygote as seen from the sandbox: its process, control socket and jobs.

``Zygote`` starts ``_sandbox_worker.py`` jailed, then asks it (over a SOCK_SEQPACKET pair,
with SCM_RIGHTS) to fork one child per verification; a reader thread turns what the zygote
reports (a child's pid, then its exit status) into ``Job`` events the sandbox waits on. Each
job carries the Landlock ruleset its child stacks (the zygote's readable roots, opened here
once, and the job's two databases): made here, where it costs no copied pages.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import envfarm
import envfarm.confined.jail
from envfarm.pipes import wait_readable
from envfarm.worker import WorkerLost, end_confined, spawn_confined
from judge import _sandbox_worker

if TYPE_CHECKING:
    from judge.sandbox import SandboxConfig

_WORKER_SCRIPT = Path(__file__).with_name("_sandbox_worker.py")
log = logging.getLogger("judge.sandbox")


@functools.lru_cache(maxsize=1)
def _can_unshare_net() -> bool:
    """Whether verifier processes can get a network namespace of their own: as root, or as uid 0
    of a user namespace (``unshare -rn``: how ``make demo`` runs for a user who is not root).
    Where not, says why once; the jail still denies them new sockets."""
    if not shutil.which("unshare"):
        why = "there is no `unshare` command"
    elif os.geteuid() != 0:
        why = "making one needs root, or running the farm under `unshare -rn`"
    else:
        try:
            if subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=5,
                              check=False).returncode == 0:
                return True
            why = "`unshare --net` is refused here"
        except (OSError, subprocess.SubprocessError) as exc:
            why = f"`unshare --net` failed: {exc}"
    log.warning("verifier processes share the farm's network namespace: %s (the jail still "
                "denies them new sockets)", why)
    return False


def _import_root() -> str:
    """Where the zygote finds ``envfarm.confined.jail`` (it runs with ``-I -S``)."""
    return str(Path(envfarm.__file__).resolve().parents[1])


def _policies(config: SandboxConfig, stage_dir: str) -> dict[str, dict]:
    """The zygote's jail (it may fork, nothing else; it reads the staging folder too; its uid
    it works out itself) and the layer each child adds (no processes, threads or signals, a
    process group of its own rather than a session: cheaper), as ``JailPolicy`` fields."""
    strict = not config.allow_unconfined
    return {"zygote": {"read_paths": [stage_dir], "memory_mb": config.memory_mb,
                       "threads": False, "processes": True, "max_open_files": 256,
                       "min_landlock_abi": 1 if strict else 0, "require_seccomp": strict},
            "child": {"memory_mb": None, "threads": False, "processes": False,
                      "new_session": False, "min_landlock_abi": 0, "require_seccomp": False}}


@functools.lru_cache(maxsize=8)
def _seccomp_filters(threads_processes: tuple[tuple[bool, bool], ...]) -> list[str]:
    """Both seccomp programs, compiled here: the zygote never loads libseccomp (nor what
    pyseccomp imports: ``threading`` puts an after-fork hook on every child). Only a policy's
    ``threads`` and ``processes`` shape its filter."""
    if not envfarm.confined.jail.support().seccomp:
        return []
    return [base64.b64encode(envfarm.confined.jail.seccomp_filter(
        envfarm.confined.jail.JailPolicy(threads=threads, processes=processes), stacked=i > 0)).decode()
        for i, (threads, processes) in enumerate(threads_processes)]


class Job:
    """One verification's child, as the zygote reports it."""

    def __init__(self) -> None:
        self.pidfd: int | None = None
        self.status: int | None = None
        self.started = threading.Event()
        self.ended = threading.Event()
        self._fd_lock = threading.Lock()  # a pidfd is signalled only while it is still ours

    def kill(self) -> None:
        self.started.wait(1.0)
        with self._fd_lock:
            if self.pidfd is not None and not self.ended.is_set():
                try:
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        with self._fd_lock:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None


class Zygote:
    """The jailed zygote process, its control socket, and the thread reading what it reports."""

    def __init__(self, config: SandboxConfig, stage_dir: str) -> None:
        self.config = config
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        identity = envfarm.confined.jail.worker_identity().config() if config.drop_privileges else {}
        policies = _policies(config, stage_dir)
        filters = _seccomp_filters(tuple((p["threads"], p["processes"])
                                         for p in policies.values()))
        zconf = json.dumps({
            "ctl_fd": theirs.fileno(), "sys_path": [_import_root()], "policies": policies,
            "seccomp": dict(zip(policies, filters)),
            "max_result_bytes": config.max_result_bytes, **identity})
        cmd = [sys.executable, "-I", "-S", "-B", str(_WORKER_SCRIPT), zconf]
        if config.isolate_network and _can_unshare_net():
            cmd = ["unshare", "--net", "--", *cmd]
        try:
            self.proc = spawn_confined(cmd, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                                       pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self._jobs: dict[int, Job] = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._roots: envfarm.confined.jail.OpenedRoots | None = None
        self.jail = self._wait_ready()
        self._reader = threading.Thread(target=self._read, name="verifier-zygote", daemon=True)
        self._reader.start()

    def _wait_ready(self) -> str:
        ready = wait_readable(self._sock.fileno(), self.config.start_timeout_s)
        msg = self._sock.recv(65536) if ready else b""
        try:
            hello = json.loads(msg) if msg else {}
        except ValueError:
            hello = {}
        if not hello.get("ready"):
            self.kill()
            why = hello.get("error") or ("did not start in time" if not ready else "exited")
            raise WorkerLost(f"verifier zygote: {why}")
        if hello.get("roots") is not None:  # it has Landlock: each job brings a ruleset
            self._roots = envfarm.confined.jail.open_roots(hello["roots"])
        return str(hello.get("jail", ""))

    def _read(self) -> None:
        note = _sandbox_worker.NOTE
        while True:
            try:
                msg = self._sock.recv(64)
            except OSError:
                msg = b""
            if not msg:
                break
            if len(msg) != note.size:
                continue
            kind, job_id, value = note.unpack(msg)
            with self._lock:  # with forget(): a pidfd is closed exactly once
                job = self._jobs.get(job_id)
                if job is not None and kind == _sandbox_worker.STARTED:
                    try:
                        job.pidfd = os.pidfd_open(value)
                    except OSError:
                        pass  # already gone: its reply, or its end, says the rest
                    job.started.set()
                elif job is not None and kind == _sandbox_worker.ENDED:
                    job.status = value
                    job.ended.set()
        with self._lock:  # the zygote is gone: its children die with it (PR_SET_PDEATHSIG)
            for job in self._jobs.values():
                job.started.set()
                job.ended.set()

    def start(self, cpu_s: float, req_r: int, rep_w: int,
              databases: tuple[str, str]) -> tuple[int, Job]:
        """Ask for a child reading ``req_r``, writing ``rep_w``, that may read ``databases``
        (and the zygote's roots) only."""
        job = Job()
        with self._lock:  # with kill(): the roots stay open while a ruleset is made of them
            fds = [req_r, rep_w]
            if self._roots is not None:
                try:
                    ruleset = envfarm.confined.jail.read_ruleset(databases, self._roots)
                except envfarm.confined.jail.JailError as exc:
                    raise WorkerLost(f"cannot confine the verifier: {exc}") from None
                fds.append(ruleset)
            self._seq = self._seq % 0xFFFF_FFFF + 1  # a u32 on the wire
            job_id = self._seq
            self._jobs[job_id] = job
            try:
                socket.send_fds(self._sock, [_sandbox_worker.JOB.pack(job_id, cpu_s)], fds)
            except OSError:
                del self._jobs[job_id]
                raise WorkerLost("verifier zygote is gone") from None
            finally:
                if len(fds) > 2:
                    os.close(fds[2])
        return job_id, job

    def forget(self, job_id: int) -> None:
        with self._lock:
            job = self._jobs.pop(job_id, None)
            if job is not None:
                job.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        end_confined(self.proc, group=True)  # the zygote and every child of its group
        self._sock.close()
        with self._lock:
            if self._roots is not None:
                self._roots.close()
                self._roots = None
