"""A pool of reusable worker processes that run untrusted verifier code.

The caller's process never executes verifier code. Each worker (``_sandbox_worker.py``) runs one
request at a time under rlimits and an audit hook; this side stages read-only copies of the two
databases, enforces the wall-clock timeout by killing the worker, and replaces workers that die,
time out or misbehave. Nothing from a worker is unpickled: the wire is length-prefixed JSON.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import queue
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from envfarm.errors import VerifierError
from judge._staging import DbInput, Stager, ro_uri
from judge._verifier_code import Mode, detect

_WORKER_SCRIPT = Path(__file__).with_name("_sandbox_worker.py")
_NOBODY = 65534


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


class VerifierResult(BaseModel):
    """The outcome of running one verifier: its JSON result, or a typed reason it has none."""

    model_config = ConfigDict(extra="forbid")

    ok: bool = Field(description="the verifier ran and returned a JSON object")
    mode: Mode = Field(description="'code' (decides itself) or 'sql' (facts for the LLM judge)")
    result: dict[str, Any] | None = Field(default=None, description="what the verifier returned")
    error: str | None = Field(default=None, description="why there is no result (a verifier_error)")
    error_kind: VerifierErrorKind | None = Field(default=None, description="machine-readable reason")
    function: str | None = Field(default=None, description="the verifier function that was called")
    elapsed_s: float = Field(default=0.0, description="wall time of the call, staging included")

    @property
    def code_result(self) -> str | None:
        """The ``result`` field of a code-mode verifier (``"complete"`` / ``"others"`` …)."""
        if self.ok and self.result is not None:
            value = self.result.get("result")
            return value if isinstance(value, str) else None
        return None

    def to_error(self) -> VerifierError:
        """The ``verifier_error`` this result stands for (only meaningful when not ok)."""
        return VerifierError(self.error or "verifier failed", reason=(
            self.error_kind.value if self.error_kind else None), mode=self.mode)

    def raise_for_error(self) -> VerifierResult:
        if not self.ok:
            raise self.to_error()
        return self


class SandboxConfig(BaseModel):
    """Limits of a verifier sandbox."""

    model_config = ConfigDict(extra="forbid")

    workers: int = Field(default=2, ge=1, le=256, description="worker processes in the pool")
    timeout_s: float = Field(default=10.0, gt=0, description="wall-clock limit per call")
    memory_mb: int = Field(default=512, ge=64, description="address-space limit per worker")
    cpu_s: float | None = Field(default=None, gt=0,
                                description="CPU-time limit per call (default: timeout_s)")
    max_calls_per_worker: int = Field(default=1000, ge=1,
                                      description="recycle a worker after this many calls")
    max_result_bytes: int = Field(default=4 << 20, ge=1024, description="largest JSON result")
    start_timeout_s: float = Field(default=15.0, gt=0, description="worker start-up limit")
    drop_privileges: bool = Field(default=True,
                                  description="run workers as nobody when this process is root")
    isolate_network: bool = Field(default=True,
                                  description="private network namespace for workers, if allowed")


class _WorkerGone(Exception):
    def __init__(self, kind: VerifierErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            raise TimeoutError
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


@functools.lru_cache(maxsize=1)
def _can_unshare_net() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "--net", "true"], capture_output=True,
                              timeout=5, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class _Worker:
    """One worker process and its two pipe ends."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.calls = 0
        self.ready = False
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        cpu_s = config.cpu_s or config.timeout_s
        drop = config.drop_privileges and os.geteuid() == 0
        wconf = json.dumps({"memory_mb": config.memory_mb, "max_cpu_s": cpu_s,
                            "max_result_bytes": config.max_result_bytes,
                            "uid": _NOBODY if drop else None})
        cmd = [sys.executable, "-I", "-S", "-B", str(_WORKER_SCRIPT), wconf]
        if config.isolate_network and _can_unshare_net():
            cmd = ["unshare", "--net", "--", *cmd]
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=to_child_r, stdout=from_child_w, stderr=subprocess.DEVNULL,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, close_fds=True,
                start_new_session=True, cwd="/",
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)

    def _recv(self, deadline: float) -> dict[str, Any]:
        size = int.from_bytes(_read_exact(self._from_child, 4, deadline), "big")
        if size > self.config.max_result_bytes + (1 << 20):
            raise _WorkerGone(VerifierErrorKind.crashed, "worker sent an oversized reply")
        data = _read_exact(self._from_child, size, deadline)
        try:
            reply = json.loads(data)
        except ValueError as exc:
            raise _WorkerGone(VerifierErrorKind.crashed, "worker sent an unreadable reply") from exc
        if not isinstance(reply, dict):
            raise _WorkerGone(VerifierErrorKind.crashed, "worker sent an unreadable reply")
        return reply

    def _died(self) -> _WorkerGone:
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self.kill()
            return _WorkerGone(VerifierErrorKind.crashed, "worker stopped answering")
        if code == -signal.SIGXCPU:
            return _WorkerGone(VerifierErrorKind.cpu, "cpu time limit exceeded")
        if code == -signal.SIGKILL:
            return _WorkerGone(VerifierErrorKind.memory, "worker killed (memory?)")
        if code < 0:
            return _WorkerGone(VerifierErrorKind.crashed,
                               f"worker crashed ({signal.Signals(-code).name})")
        return _WorkerGone(VerifierErrorKind.crashed, f"worker exited with status {code}")

    def wait_ready(self) -> None:
        if self.ready:
            return
        try:
            reply = self._recv(time.monotonic() + self.config.start_timeout_s)
        except TimeoutError:
            self.kill()
            raise _WorkerGone(VerifierErrorKind.crashed, "worker did not start in time") from None
        except EOFError:
            raise self._died() from None
        if not reply.get("ready"):
            self.kill()
            raise _WorkerGone(VerifierErrorKind.crashed, "worker sent no ready message")
        self.ready = True

    def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.wait_ready()
        data = json.dumps(request).encode()
        self.calls += 1
        deadline = time.monotonic() + timeout_s
        try:
            view = memoryview(len(data).to_bytes(4, "big") + data)
            while view:
                view = view[os.write(self._to_child, view):]
            return self._recv(deadline)
        except TimeoutError:
            self.kill()
            raise _WorkerGone(VerifierErrorKind.timeout, f"timeout after {timeout_s:g} s") from None
        except (EOFError, BrokenPipeError):
            raise self._died() from None

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
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self._to_child = self._from_child = -1


def _shutdown(workers: list[_Worker], stager: Stager) -> None:
    for w in list(workers):
        w.kill()
    stager.close()


class VerifierSandbox:
    """Runs verifier code in a pool of sandboxed, reusable worker processes.

    ``await sandbox.run(code, initial_db, final_db)`` or ``sandbox.run_sync(...)``; a verifier
    that fails in any way gives ``VerifierResult(ok=False, error=...)``, never an exception.
    Usable as a (sync or async) context manager; ``close()`` kills the workers.
    """

    def __init__(self, workers: int = 2, timeout_s: float = 10.0, memory_mb: int = 512,
                 **options: Any) -> None:
        self.config = SandboxConfig(workers=workers, timeout_s=timeout_s, memory_mb=memory_mb,
                                    **options)
        self._stager = Stager()
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=self.config.workers,
                                            thread_name_prefix="verifier-sandbox")
        for _ in range(self.config.workers):
            self._idle.put(self._spawn())
        self._finalizer = weakref.finalize(self, _shutdown, self._all, self._stager)

    # -- pool -------------------------------------------------------------------------------
    def _spawn(self) -> _Worker:
        worker = _Worker(self.config)
        with self._lock:
            self._all.append(worker)
        return worker

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)

    def _acquire(self) -> _Worker:
        while True:
            if self._closed:
                raise RuntimeError("VerifierSandbox is closed")
            try:
                worker = self._idle.get(timeout=0.25)
                break
            except queue.Empty:
                continue
        if not worker.alive():
            self._retire(worker)
            worker = self._spawn()
        return worker

    def _release(self, worker: _Worker, recycle: bool) -> None:
        if recycle or worker.calls >= self.config.max_calls_per_worker or not worker.alive():
            self._retire(worker)
            worker = self._spawn()  # starts now, ready by the next call
        if self._closed:
            self._retire(worker)
            return
        self._idle.put(worker)

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers (for tests and monitoring)."""
        with self._lock:
            return [w.proc.pid for w in self._all if w.alive()]

    # -- running ----------------------------------------------------------------------------
    def run_sync(self, code: str, initial_db: DbInput, final_db: DbInput,
                 final_answer: str | None = None, mode: Mode | None = None, *,
                 function_name: str | None = None, raw_response: str | None = None,
                 timeout_s: float | None = None) -> VerifierResult:
        """Run one verifier and wait for it; refuses to run inside a running event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("run_sync() inside a running event loop; use `await run()`")
        return self._run_blocking(code, initial_db, final_db, final_answer, mode, function_name,
                                  raw_response, timeout_s)

    async def run(self, code: str, initial_db: DbInput, final_db: DbInput,
                  final_answer: str | None = None, mode: Mode | None = None, *,
                  function_name: str | None = None, raw_response: str | None = None,
                  timeout_s: float | None = None) -> VerifierResult:
        """Run one verifier in a worker process; see the class docstring."""
        if self._closed:
            raise RuntimeError("VerifierSandbox is closed")
        loop = asyncio.get_running_loop()
        call = functools.partial(self._run_blocking, code, initial_db, final_db, final_answer,
                                 mode, function_name, raw_response, timeout_s)
        return await loop.run_in_executor(self._executor, call)

    def _run_blocking(self, code: str, initial_db: DbInput, final_db: DbInput,
                      final_answer: str | None, mode: Mode | None, function_name: str | None,
                      raw_response: str | None, timeout_s: float | None) -> VerifierResult:
        t0 = time.perf_counter()
        spec = detect(code, mode, function_name, raw_response)

        def fail(kind: VerifierErrorKind, error: str) -> VerifierResult:
            return VerifierResult(ok=False, mode=spec.mode, function=spec.function, error=error,
                                  error_kind=kind, elapsed_s=time.perf_counter() - t0)

        if spec.syntax_error:
            return fail(VerifierErrorKind.syntax, spec.syntax_error)
        if final_answer is not None and not isinstance(final_answer, str):
            final_answer = json.dumps(final_answer)
        staged: list[tuple[str, bool]] = []
        try:
            for db in (initial_db, final_db):
                try:
                    staged.append(self._stager.stage(db))
                except (OSError, ValueError, sqlite3.Error) as exc:
                    return fail(VerifierErrorKind.bad_input, f"cannot stage database: {exc}")
            (initial, _), (final, _) = staged
            request = {
                "key": hashlib.blake2b(code.encode(), digest_size=16).hexdigest(),
                "code": code, "func": spec.function, "mode": spec.mode,
                "takes_answer": spec.takes_answer,
                "initial": initial, "final": final,
                "initial_uri": ro_uri(initial), "final_uri": ro_uri(final),
                "final_answer": final_answer,
                "cpu_s": self.config.cpu_s or self.config.timeout_s,
            }
            worker = self._acquire()
            recycle = True
            try:
                reply = worker.call(request, timeout_s or self.config.timeout_s)
                recycle = bool(reply.get("recycle"))
            except _WorkerGone as gone:
                return fail(gone.kind, gone.message)
            finally:
                self._release(worker, recycle)
        finally:
            for path, cached in staged:
                self._stager.release(path, cached)
        if not reply.get("ok"):
            try:
                kind = VerifierErrorKind(reply.get("kind"))
            except ValueError:
                kind = VerifierErrorKind.crashed
            return fail(kind, str(reply.get("error") or "verifier failed"))
        try:
            result = json.loads(reply["result_json"])
        except (KeyError, TypeError, ValueError):
            return fail(VerifierErrorKind.crashed, "worker sent an unreadable result")
        return VerifierResult(ok=True, mode=spec.mode, function=spec.function, result=result,
                              elapsed_s=time.perf_counter() - t0)

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every worker and delete the staged databases. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)
