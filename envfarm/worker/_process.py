"""The front's side of one env worker: spawn it, talk to it, supervise it.

The worker is a child process in its own session with an empty environment, no descriptors but
its two pipes, and (once it says ``ready``) the kernel jail. The front checks every reply
against a request it sent (ids it made, bounded frames), gives each request a deadline, and
kills the worker when it misses one, breaks the protocol or stops reading: every instance it
held is then lost (``WorkerLost``), never silently replaced.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from envfarm.hostcode import host_finalizer
from envfarm.worker import _frames

#: Bytes the front buffers for a worker that does not read them before giving up on it.
MAX_PENDING_WRITE = 64 << 20
#: Requests whose caller went away, remembered so their late answers are not taken for forgeries.
MAX_ABANDONED = 100_000
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
#: Workers die with the *thread* that spawned them (PR_SET_PDEATHSIG): spawn them all from one
#: thread that lives as long as the process, whichever thread asks.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envfarm-spawner")


class WorkerLost(Exception):
    """The worker is gone; ``reason`` says why (every instance it held is lost)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WorkerStartError(Exception):
    """The worker did not start, or the env's code did not load in it."""


def _end(proc: subprocess.Popen) -> None:
    """Kill, reap, close the pipes (once: the front never hands them to a loop transport)."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except OSError:
            pass


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _exit_reason(code: int | None) -> str:
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


class WorkerProcess:
    """One env worker process and its channel."""

    _ids = itertools.count(1)

    def __init__(self, config: dict[str, Any], *, stderr: bool = False) -> None:
        self.index = next(WorkerProcess._ids)
        cmd = [sys.executable, "-s", "-B", "-m", "envfarm.worker",
               json.dumps(config)]
        self.proc = _SPAWNER.submit(
            subprocess.Popen, cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=None if stderr else subprocess.DEVNULL,
            env={"PYTHONPATH": _PROJECT_ROOT, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            close_fds=True, start_new_session=True, cwd="/").result()
        self.pid = self.proc.pid
        # A front that drops its handle (or exits) without stopping the worker still ends it.
        self._reaper = host_finalizer(self, _end, self.proc)
        self.jail: str | None = None
        self.lost: str | None = None
        self.leases = 0  # instances the front has placed here and not dropped
        self.placed = 0  # instances placed here over its life
        self.idle_since: float | None = time.monotonic()  # None while it holds a lease
        #: Takes no new leases, and stops once its last lease is gone (a call timed out in it:
        #: that call's code may still be running there).
        self.draining = False
        #: The loop watching the channel's pipes, once attached. Not asyncio's pipe transports:
        #: uvloop's close a pipe's fd (libuv) and then the pipe object given them, the same fd
        #: number twice; a descriptor another thread opened in between (a verifier's reply
        #: pipe) was closed under it (verify read EBADF under load). The fds are this object's
        #: alone, closed once, by ``_end``.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._frames_in = _frames.FrameReader()
        self._unsent = bytearray()  # what the pipe did not take yet
        self._watching_room = False  # the loop watches the pipe for room to write the rest
        self._batch: list[bytes] = []  # frames written at the end of this loop iteration
        self._pending: dict[int, asyncio.Future] = {}
        self._abandoned: dict[int, None] = {}  # ids whose caller went away, oldest first
        self._rids = itertools.count(1)
        self._closed_by_front: str | None = None

    # -- start-up (blocking; the caller runs it in a thread when a loop is running) --------
    def start(self, load: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], bytes]:
        """Wait for ``ready``, send ``load``; returns the load reply (tools, template bytes)."""
        deadline = time.monotonic() + timeout_s
        try:
            hello, _ = _frames.read_blocking(self.proc.stdout.fileno(), deadline)
            if not hello.get("ready"):
                raise WorkerStartError("the worker did not say ready")
            self.jail = str(hello.get("jail"))
            _frames.write_all(self.proc.stdin.fileno(), _frames.encode(load))
            reply, template = _frames.read_blocking(self.proc.stdout.fileno(), deadline)
        except TimeoutError:
            self.kill("did not start in time")
            raise WorkerStartError(f"env worker did not start within {timeout_s:g} s") from None
        except (EOFError, BrokenPipeError, _frames.FrameError) as exc:
            self.kill("start failed")
            raise WorkerStartError(
                f"env worker failed to start: {self._exit_reason_now()}"
                f" ({type(exc).__name__})") from None
        if not reply.get("ok"):
            self.kill("env failed to load")
            raise WorkerStartError(str(reply.get("error") or "the env failed to load"))
        return reply, template

    def _exit_reason_now(self) -> str:
        try:
            return _exit_reason(self.proc.wait(timeout=2))
        except subprocess.TimeoutExpired:
            return "stopped answering"

    async def attach(self) -> None:
        """Hand the channel to the running loop (after ``start``)."""
        if self._loop is not None or self.lost is not None:
            return
        self._loop = asyncio.get_running_loop()
        for pipe in (self.proc.stdin, self.proc.stdout):
            os.set_blocking(pipe.fileno(), False)
        self._loop.add_reader(self.proc.stdout.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.proc.stdout.fileno(), 1 << 18)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._on_eof()
            return
        try:
            for body in self._frames_in.feed(data):
                self._on_reply(*_frames.decode(body))
                if self.lost is not None:
                    return
        except _frames.FrameError as exc:
            self.kill(f"broke the channel protocol ({exc})")

    # -- requests ---------------------------------------------------------------------------
    def post(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """A request that gets no reply (``new``, ``drop``)."""
        self._write(_frames.encode(header, payload))

    async def request(self, header: dict[str, Any], timeout_s: float,
                      payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        """Send one request and wait for its reply; WorkerLost if the worker is (or goes) away,
        or misses the deadline (then it is killed: what it was doing can no longer be trusted)."""
        if self.lost is not None:
            raise WorkerLost(self.lost)
        rid = next(self._rids)
        future = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._write(_frames.encode(dict(header, id=rid), payload))
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            self.kill(f"a request ran past its {timeout_s:g} s deadline")
            raise WorkerLost(self.lost or "killed") from None
        except asyncio.CancelledError:
            # The caller went away (a client hung up, Serve cancelled its request): the worker
            # still answers, and that answer is expected, not a forgery.
            self._abandoned[rid] = None
            while len(self._abandoned) > MAX_ABANDONED:
                self._abandoned.pop(next(iter(self._abandoned)))
            raise
        finally:
            self._pending.pop(rid, None)

    def _write(self, data: bytes) -> None:
        """Queue a frame; the frames of one event-loop iteration go out in one write (under
        load, one syscall and one wake-up of the worker for many calls)."""
        if self.lost is not None:
            raise WorkerLost(self.lost)
        if not self._batch:
            asyncio.get_running_loop().call_soon(self._flush)
        self._batch.append(data)

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if self.lost is not None or self._loop is None or not batch:
            return
        waiting = bool(self._unsent)
        self._unsent += b"".join(batch)
        if not waiting:
            self._send()
        if len(self._unsent) > MAX_PENDING_WRITE:
            self.kill("stopped reading its channel")

    def _send(self) -> None:
        """Write what the pipe takes; watch it for room while anything is left."""
        if self.lost is not None or self._loop is None:
            return
        fd = self.proc.stdin.fileno()
        try:
            sent = os.write(fd, self._unsent)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # it closed its end: gone, and its stdout's EOF says why
            self._on_eof()
            return
        del self._unsent[:sent]
        if self._unsent and not self._watching_room:
            self._loop.add_writer(fd, self._send)
            self._watching_room = True
        elif not self._unsent and self._watching_room:
            self._loop.remove_writer(fd)
            self._watching_room = False

    def _on_reply(self, header: dict[str, Any], payload: bytes) -> None:
        rid = header.get("id")
        future = self._pending.get(rid) if isinstance(rid, int) else None
        if future is None and rid in self._abandoned:
            del self._abandoned[rid]  # the answer to a request whose caller went away
            return
        if future is None:  # a reply to nothing the front asked: it cannot be trusted
            self.kill(f"answered a request it was never sent (id {rid!r})")
            return
        if header.get("drain"):
            self.draining = True
        if not future.done():
            future.set_result((header, payload))

    def _on_eof(self) -> None:
        if self.lost is None:
            code = self.proc.poll()
            if code is None:
                try:
                    code = self.proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    code = None
            self._mark_lost(_exit_reason(code))
        self.kill(self.lost)

    def _mark_lost(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = f"env worker {self.pid} {reason}"
        for future in self._pending.values():
            if not future.done():
                future.set_exception(WorkerLost(self.lost))

    # -- ending -----------------------------------------------------------------------------
    def kill(self, reason: str | None = None) -> None:
        """SIGKILL the worker (idempotent); every pending and later request gets WorkerLost."""
        self._mark_lost(reason or "was stopped by the front")
        self._batch = []
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._unsent.clear()  # the process is dead: nothing buffered can be delivered
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            self._reaper()  # waits for it, closes the pipes
        elif _running_loop() is loop:
            self._unwatch_and_end(loop)
        else:  # a watched fd is unwatched by its loop's thread
            loop.call_soon_threadsafe(self._unwatch_and_end, loop)

    def _unwatch_and_end(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self.proc.stdout.fileno())
        loop.remove_writer(self.proc.stdin.fileno())
        self._reaper()  # waits for it, closes the pipes

    def alive(self) -> bool:
        return self.lost is None and self.proc.poll() is None
