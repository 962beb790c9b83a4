"""Runs untrusted verifier code, each verification in a fresh, kernel-confined process.

The caller's process never executes verifier code. A zygote (``_sandbox_worker.py``, started
once, jailed, with the allowed modules loaded) forks one child per verification. For each, this
side stages read-only copies of the two databases, compiles the verifier (once per distinct
code: compiling runs nothing), writes the request with its bytecode into a new pipe and hands
the zygote that pipe's read end and a second pipe's write end for the reply; the zygote answers
with the child's pid (this side kills it at the deadline, through a pidfd) and, later, its exit
status. A reply is read only from the pipe made for that request, size-capped and checked for
shape, so a verifier can answer for its own verification and no other. Nothing from a child is
unpickled: a reply is length-prefixed JSON.
"""

from __future__ import annotations

import asyncio
import fcntl
import signal
import functools
import json
import marshal
import os
import sqlite3
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from envfarm.confined.hostcode import host_finalizer
from envfarm.errors import VerifierError
from envfarm.pipes import read_exact
from envfarm.worker import WorkerLost, exit_reason
from judge._staging import DbInput, Stager, ro_uri
from judge._verifier_code import _AST_LOCK, Mode, detect
from judge._zygote import Zygote

_F_SETPIPE_SZ = 1031
_MAX_REQUEST = 1 << 20  # the default pipe-max-size: a request fits its pipe, no writer blocks


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

    workers: int = Field(default=2, ge=1, le=256,
                         description="verifications at once (a fresh process each)")
    timeout_s: float = Field(default=10.0, gt=0, description="wall-clock limit per call")
    memory_mb: int = Field(default=512, ge=64, description="address-space limit per process")
    cpu_s: float | None = Field(default=None, gt=0,
                                description="CPU-time limit per call (default: timeout_s)")
    max_result_bytes: int = Field(default=4 << 20, ge=1024, description="largest JSON result")
    start_timeout_s: float = Field(default=15.0, gt=0, description="zygote start-up limit")
    drop_privileges: bool = Field(default=True,
                                  description="run verifiers as an unprivileged uid of their own when "
                                  "this process is root")
    isolate_network: bool = Field(default=True,
                                  description="private network namespace too, if allowed")
    allow_unconfined: bool = Field(
        default=False, description="run verifiers without the kernel jail where the kernel "
        "lacks seccomp or Landlock (otherwise every verification fails, typed)")



@functools.lru_cache(maxsize=256)
def _bytecode(code: str) -> tuple[bytes | None, str | None]:
    """The verifier compiled once (a task's verifier is checked again and again) and marshalled
    for its child: (bytecode, None) or (None, syntax error). Compiling runs nothing; this
    process already parses the same code to find its function."""
    try:
        with _AST_LOCK:
            compiled = compile(code, "<verifier>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return None, f"syntax error: {exc}"
    return marshal.dumps(compiled), None


def _request(fields: dict[str, Any], bytecode: bytes) -> bytes:
    """What a child reads (see the worker's ``_recv``): lengths, fields, bytecode."""
    head = marshal.dumps(fields)
    return b"".join((struct.pack("!II", len(head), len(bytecode)), head, bytecode))


_REPLY_KEYS = {True: {"ok", "result_json"}, False: {"ok", "kind", "error"}}


def _check_reply(reply: object) -> dict[str, Any]:
    """A reply has exactly the shape the child's harness writes; anything else is a crash."""
    if (isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
            and set(reply) == _REPLY_KEYS[reply["ok"]]
            and all(isinstance(reply[k], str) for k in reply if k != "ok")):
        return reply
    raise WorkerLost("verifier process sent a malformed reply", kind=VerifierErrorKind.crashed)


def gone_for(status: int | None) -> WorkerLost:
    """What a child's wait status means when it sent no reply."""
    if status is None:
        return WorkerLost("verifier process ended without a reply", kind=VerifierErrorKind.crashed)
    code = os.waitstatus_to_exitcode(status)
    kind = {-signal.SIGXCPU: VerifierErrorKind.cpu,
            -signal.SIGKILL: VerifierErrorKind.memory}.get(code, VerifierErrorKind.crashed)
    return WorkerLost(f"verifier process: {exit_reason(code)}", kind=kind)


def _shutdown(zygotes: list[Zygote], stager: Stager) -> None:
    for z in list(zygotes):
        z.kill()
    stager.close()


class VerifierSandbox:
    """Runs each verifier in a fresh, kernel-confined process forked from a warm zygote.

    ``await sandbox.run(code, initial_db, final_db)`` or ``sandbox.run_sync(...)``; a verifier
    that fails in any way gives ``VerifierResult(ok=False, error=...)``, never an exception.
    Usable as a (sync or async) context manager; ``close()`` kills the zygote and its children.
    """

    def __init__(self, workers: int = 2, timeout_s: float = 10.0, memory_mb: int = 512,
                 **options: Any) -> None:
        self.config = SandboxConfig(workers=workers, timeout_s=timeout_s, memory_mb=memory_mb,
                                    **options)
        self._stager = Stager()
        self._lock = threading.Lock()
        self._zygotes: list[Zygote] = []  # the current one last; a list for the finalizer
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=self.config.workers,
                                            thread_name_prefix="verifier-sandbox")
        self._finalizer = host_finalizer(self, _shutdown, self._zygotes, self._stager)
        try:
            self._zygote()
        except WorkerLost:
            pass  # reported, typed, by each call until it starts

    def _zygote(self) -> Zygote:
        with self._lock:
            if self._closed:
                raise RuntimeError("VerifierSandbox is closed")
            if self._zygotes and self._zygotes[-1].alive():
                return self._zygotes[-1]
            for old in self._zygotes:
                old.kill()
            self._zygotes.clear()
            self._zygotes.append(Zygote(self.config, self._stager.dir))
            return self._zygotes[-1]

    @property
    def pids(self) -> list[int]:
        """Process id of the zygote, while it runs (for tests and monitoring)."""
        with self._lock:
            return [z.proc.pid for z in self._zygotes if z.alive()]

    @property
    def jail(self) -> str:
        """What confines the verifiers, as the zygote reported it ('' before it started)."""
        with self._lock:
            return self._zygotes[-1].jail if self._zygotes else ""

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
        """Run one verifier in a fresh process; see the class docstring."""
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
            for db, keep in ((initial_db, True), (final_db, False)):
                try:
                    staged.append(self._stager.stage(db, keep))
                except (OSError, ValueError, sqlite3.Error) as exc:
                    return fail(VerifierErrorKind.bad_input, f"cannot stage database: {exc}")
            (initial, _), (final, _) = staged
            bytecode, syntax_error = _bytecode(code)
            if syntax_error:
                return fail(VerifierErrorKind.syntax, syntax_error)
            request = _request({
                "func": spec.function, "mode": spec.mode, "takes_answer": spec.takes_answer,
                "initial": initial, "final": final,
                "initial_uri": ro_uri(initial), "final_uri": ro_uri(final),
                "final_answer": final_answer,
            }, bytecode)
            try:
                reply = self._call(request, (initial, final), timeout_s or self.config.timeout_s)
            except WorkerLost as gone:
                return fail(VerifierErrorKind(gone.kind or VerifierErrorKind.crashed), gone.reason)
        finally:
            for path, cached in staged:
                self._stager.release(path, cached)
        if not reply["ok"]:
            try:
                kind = VerifierErrorKind(reply["kind"])
            except ValueError:
                kind = VerifierErrorKind.crashed
            return fail(kind, reply["error"])
        try:
            result = json.loads(reply["result_json"])
        except ValueError:
            return fail(VerifierErrorKind.crashed, "verifier process sent an unreadable result")
        if not isinstance(result, dict):
            return fail(VerifierErrorKind.crashed, "verifier process sent a malformed result")
        return VerifierResult(ok=True, mode=spec.mode, function=spec.function, result=result,
                              elapsed_s=time.perf_counter() - t0)

    def _call(self, frame: bytes, databases: tuple[str, str],
              timeout_s: float) -> dict[str, Any]:
        """One request to one fresh child, over two pipes made for it alone; of the staged
        files it may read ``databases`` only."""
        if len(frame) > _MAX_REQUEST:
            raise WorkerLost(f"verifier request too large ({len(frame)} bytes)",
                             kind=VerifierErrorKind.bad_input)
        zygote = self._zygote()
        req_r, req_w = os.pipe2(os.O_CLOEXEC)
        rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
        try:
            if len(frame) > 65536:
                fcntl.fcntl(req_w, _F_SETPIPE_SZ, len(frame))
            view = memoryview(frame)
            while view:  # fits the pipe: never blocks
                view = view[os.write(req_w, view):]
            os.close(req_w)
            req_w = -1
            cpu_s = self.config.cpu_s or self.config.timeout_s
            job_id, job = zygote.start(cpu_s, req_r, rep_w, databases)
        except BaseException:
            for fd in (req_w, rep_r):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)  # the child holds the only write end now: EOF when it ends
        try:
            deadline = time.monotonic() + timeout_s
            try:
                size = int.from_bytes(read_exact(rep_r, 4, deadline), "big")
                if size > self.config.max_result_bytes + (1 << 16):
                    job.kill()
                    raise WorkerLost("verifier process sent an oversized reply",
                                     kind=VerifierErrorKind.crashed)
                raw = read_exact(rep_r, size, deadline)
            except TimeoutError:
                job.kill()
                raise WorkerLost(f"timeout after {timeout_s:g} s",
                                 kind=VerifierErrorKind.timeout) from None
            except EOFError:
                job.ended.wait(2.0)
                raise gone_for(job.status) from None
            try:
                return _check_reply(json.loads(raw))
            except ValueError:
                raise WorkerLost("verifier process sent an unreadable reply",
                                 kind=VerifierErrorKind.crashed) from None
        finally:
            os.close(rep_r)
            job.kill()  # it replied or failed: nothing it does after that may run on
            zygote.forget(job_id)

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Kill the zygote (its children die with it) and delete the staged databases."""
        with self._lock:
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
