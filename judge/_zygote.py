"""The verifier zygote as seen from the sandbox: its process, control socket and jobs.

``Zygote`` starts ``_sandbox_worker.py`` jailed, then asks it (over a SOCK_SEQPACKET pair,
with SCM_RIGHTS) to fork one child per verification; a reader thread turns what the zygote
reports (a child's pid, then its exit status) into ``Job`` events the sandbox waits on.
"""

from __future__ import annotations

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
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import envfarm
import envfarm.jail
from envfarm.pipes import wait_readable

if TYPE_CHECKING:
    from judge.sandbox import SandboxConfig

_WORKER_SCRIPT = Path(__file__).with_name("_sandbox_worker.py")
log = logging.getLogger("judge.sandbox")


class VerifierErrorKind(str, Enum):
    """Why a verifier gave no result."""

    syntax = "syntax"
    no_function = "no_function"
    raised = "raised"
    timeout = "timeout"
    cpu = "cpu"
    memory = "memory"
    forbidden = "forbidden"
    bad_return = "bad_return"
    crashed = "crashed"
    bad_input = "bad_input"


class WorkerGone(Exception):
    def __init__(self, kind: VerifierErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


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


def _import_roots() -> list[str]:
    """Where the zygote finds ``envfarm.jail`` and ``pyseccomp`` (it runs with ``-I -S``)."""
    import pyseccomp

    return sorted({str(Path(envfarm.__file__).resolve().parents[1]),
                   str(Path(pyseccomp.__file__).resolve().parent)})


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
        identity = envfarm.jail.worker_identity().config() if config.drop_privileges else {}
        zconf = json.dumps({
            "ctl_fd": theirs.fileno(), "sys_path": _import_roots(), "stage_dir": stage_dir,
            "memory_mb": config.memory_mb, "max_result_bytes": config.max_result_bytes,
            "allow_unconfined": config.allow_unconfined, **identity})
        cmd = [sys.executable, "-I", "-S", "-B", str(_WORKER_SCRIPT), zconf]
        if config.isolate_network and _can_unshare_net():
            cmd = ["unshare", "--net", "--", *cmd]
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True, cwd="/")
        finally:
            theirs.close()
        self._jobs: dict[int, Job] = {}
        self._lock = threading.Lock()
        self._seq = 0
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
            raise WorkerGone(VerifierErrorKind.crashed, f"verifier zygote: {why}")
        return str(hello.get("jail", ""))

    def _read(self) -> None:
        while True:
            try:
                msg = self._sock.recv(4096)
            except OSError:
                msg = b""
            if not msg:
                break
            try:
                note = json.loads(msg)
                with self._lock:  # with forget(): a pidfd is closed exactly once
                    job = self._jobs.get(note["id"])
                    if job is not None and "pid" in note:
                        try:
                            job.pidfd = os.pidfd_open(int(note["pid"]))
                        except OSError:
                            pass  # already gone: its reply, or its end, says the rest
                        job.started.set()
                    elif job is not None and "status" in note:
                        job.status = int(note["status"])
                        job.ended.set()
            except (ValueError, KeyError, TypeError):
                continue
        with self._lock:  # the zygote is gone: its children die with it (PR_SET_PDEATHSIG)
            for job in self._jobs.values():
                job.started.set()
                job.ended.set()

    def start(self, cpu_s: float, req_r: int, rep_w: int) -> tuple[int, Job]:
        job = Job()
        with self._lock:
            self._seq += 1
            job_id = self._seq
            self._jobs[job_id] = job
            try:
                socket.send_fds(self._sock, [json.dumps({"id": job_id, "cpu_s": cpu_s}).encode()],
                                [req_r, rep_w])
            except OSError:
                del self._jobs[job_id]
                raise WorkerGone(VerifierErrorKind.crashed, "verifier zygote is gone") from None
        return job_id, job

    def forget(self, job_id: int) -> None:
        with self._lock:
            job = self._jobs.pop(job_id, None)
            if job is not None:
                job.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._sock.close()


def gone_for(status: int | None) -> WorkerGone:
    """What a child's exit status means when it sent no reply."""
    if status is None:
        return WorkerGone(VerifierErrorKind.crashed, "verifier process ended without a reply")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return WorkerGone(VerifierErrorKind.cpu, "cpu time limit exceeded")
        if sig == signal.SIGKILL:
            return WorkerGone(VerifierErrorKind.memory, "verifier process killed (memory?)")
        return WorkerGone(VerifierErrorKind.crashed,
                           f"verifier process crashed ({signal.Signals(sig).name})")
    return WorkerGone(VerifierErrorKind.crashed,
                       f"verifier process exited with status {os.WEXITSTATUS(status)}")
