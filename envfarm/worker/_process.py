"""The front's side of one env worker: spawn it, talk to it, supervise it.

The worker is a child process in its own session with an empty environment, no descriptors but
its two pipes, and (once it says ``ready``) the kernel jail. The front distrusts every byte it
sends: a reply's header is bounded and parsed before anything else, must name a request the
front sent and not yet saw answered, and its payload must fit that request's cap, or the frame
is refused before its payload is read. Each request has a deadline. A worker that misses one,
breaks the protocol or stops reading is killed: each request in flight then fails with a
``WorkerLost`` that says whether its own answer was at fault (``GUILTY``), another's was
(``INNOCENT``) or nobody can tell (``SUSPECT``); ``WorkerEnv`` decides from that what becomes
of each lease (``docs/tenancy.md``).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envfarm.confined import frames
from envfarm.confined.hostcode import host_finalizer
from envfarm.worker._spawn import WorkerLost, end_confined, exit_reason, spawn_confined

#: Bytes the front buffers for a worker that does not read them before giving up on it.
MAX_PENDING_WRITE = 64 << 20
#: Bytes of a worker's stderr the front keeps (the last ones): what a worker that failed to
#: start said, e.g. the module its interpreter could not import.
STDERR_TAIL = 2000
#: Requests whose caller went away, remembered so their late answers are not taken for forgeries.
MAX_ABANDONED = 100_000
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

#: Verdicts on a request that was in flight when its worker was lost.
GUILTY, INNOCENT, SUSPECT = "guilty", "innocent", "suspect"
#: ``kill(guilty=ANSWERED)``: the guilty request was answered already (its answer failed the
#: front's checks after it was read): every request still in flight is innocent.
ANSWERED = 0


class WorkerStartError(Exception):
    """The worker did not start, or the env's code did not load in it."""


class _Flight:
    """A request the front sent and has not seen answered. ``future`` is None once its caller
    went away (its answer is still due, once). ``cap``: payload bytes its answer may carry;
    ``answer_cap``: of those, bytes of the answer proper (header ``rlen``; the rest is a state
    delta)."""

    __slots__ = ("future", "cap", "answer_cap", "deadline")

    def __init__(self, future: asyncio.Future, cap: int, answer_cap: int, deadline: float
                 ) -> None:
        self.future: asyncio.Future | None = future
        self.cap = cap
        self.answer_cap = answer_cap
        self.deadline = deadline


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class WorkerProcess:
    """One env worker process and its channel."""

    _ids = itertools.count(1)

    def __init__(self, config: dict[str, Any], *, stderr: bool = False) -> None:
        self.index = next(WorkerProcess._ids)
        cmd = [sys.executable, "-s", "-B", "-m", "envfarm.confined",
               json.dumps(config)]
        # Its stderr comes to the front (unless it goes to the front's own, for debugging),
        # which keeps its tail: a worker that dies at start says why.
        self.proc = spawn_confined(
            cmd, env={"PYTHONPATH": _PROJECT_ROOT, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            pipes=True, stderr=True if stderr else "pipe")
        self._stderr_tail = bytearray()
        if self.proc.stderr is not None:  # read without waiting, whoever reads it
            os.set_blocking(self.proc.stderr.fileno(), False)
        self.pid = self.proc.pid
        # A front that drops its handle (or exits) without stopping the worker still ends it.
        self._reaper = host_finalizer(self, end_confined, self.proc)
        self.jail: str | None = None
        self.lost: str | None = None
        self.leases = 0  # instances the front has placed here and not dropped
        self.placed = 0  # instances placed here over its life
        self.idle_since: float | None = time.monotonic()  # None while it holds a lease
        #: Takes no new leases, and stops once its last lease is gone (a call timed out in it:
        #: that call's code may still be running there).
        self.draining = False
        #: The one tenant whose leases it holds, from its first lease on (``WorkerEnv``).
        self.tenant: str | None = None
        #: Set by the env that placed leases here: told once, on the loop, when it is lost.
        self.on_lost: Callable[[WorkerProcess], None] | None = None
        #: The lease handles placed here (``WorkerEnv``'s ``RemoteInstance``s), and the bytes of
        #: their committed state the front keeps (``CommittedState``).
        self.held: set[Any] = set()
        self.kept_bytes = 0
        #: The loop watching the channel's pipes, once attached. Not asyncio's pipe transports:
        #: uvloop's close a pipe's fd (libuv) and then the pipe object given them, the same fd
        #: number twice; a descriptor another thread opened in between (a verifier's reply
        #: pipe) was closed under it (verify read EBADF under load). The fds are this object's
        #: alone, closed once, by ``end_confined``.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._frames_in = frames.ReplyReader(self._admit, self._on_reply)
        self._unsent = bytearray()  # what the pipe did not take yet
        self._watching_room = False  # the loop watches the pipe for room to write the rest
        self._batch: list[bytes] = []  # frames written at the end of this loop iteration
        self._flights: dict[int, _Flight] = {}  # sent, not answered (abandoned ones too)
        self._abandoned: dict[int, None] = {}  # ids whose caller went away, oldest first
        self._rids = itertools.count(1)
        #: Seconds with a request in flight, for the CPU watch: a worker burning more CPU
        #: than that allows runs code no call asked for.
        self._busy_s = 0.0
        self._busy_from = 0.0

    # -- start-up (blocking; the caller runs it in a thread when a loop is running) --------
    def start(self, load: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], bytes]:
        """Wait for ``ready``, send ``load``; returns the load reply (tools, template bytes)."""
        deadline = time.monotonic() + timeout_s
        try:
            hello, _ = frames.read_blocking(self.proc.stdout.fileno(), deadline,
                                             max_header=frames.MAX_REPLY_HEADER)
            if not hello.get("ready"):
                raise WorkerStartError("the worker did not say ready")
            self.jail = str(hello.get("jail"))[:1000]
            frames.write_all(self.proc.stdin.fileno(), frames.encode(load))
            reply, template = frames.read_blocking(self.proc.stdout.fileno(), deadline)
        except TimeoutError:
            self.kill("did not start in time")
            raise WorkerStartError(f"env worker did not start within {timeout_s:g} s") from None
        except (EOFError, BrokenPipeError, frames.FrameError) as exc:
            reason = self._exit_reason_now()
            said = self.stderr_tail()
            self.kill("start failed")
            raise WorkerStartError(
                f"env worker failed to start: {reason} ({type(exc).__name__}: {str(exc)[:200]})"
                + (f"; its stderr ends: {said}" if said else "")) from None
        if not reply.get("ok"):
            self.kill("env failed to load")
            raise WorkerStartError(str(reply.get("error") or "the env failed to load")[:2000])
        return reply, template

    def stderr_tail(self) -> str:
        """The last ``STDERR_TAIL`` bytes the worker wrote to its stderr so far (read now, without
        blocking, where the loop does not watch it yet)."""
        if self.proc.stderr is not None and self._loop is None:
            self._read_stderr()
        return self._stderr_tail.decode("utf-8", "replace").strip()

    def _read_stderr(self) -> None:
        fd = self.proc.stderr.fileno()
        for _ in range(64):  # at most 16 MiB per wake-up; the rest at the next
            try:
                data = os.read(fd, 1 << 18)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                if self._loop is not None:
                    self._loop.remove_reader(fd)
                return
            self._stderr_tail += data
            del self._stderr_tail[:-STDERR_TAIL]

    def _exit_reason_now(self) -> str:
        try:
            return exit_reason(self.proc.wait(timeout=2))
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
        if self.proc.stderr is not None:  # drained as it comes: a full pipe would stall the worker
            self._loop.add_reader(self.proc.stderr.fileno(), self._read_stderr)

    @property
    def attached(self) -> bool:
        return self._loop is not None

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
        self.received(data)

    def received(self, data: bytes) -> None:
        """Bytes from the worker's pipe: frames are admitted, read and delivered, or the worker
        is killed at the first that breaks the rules."""
        try:
            self._frames_in.feed(data)
        except frames.FrameError as exc:
            self.kill(f"broke the channel protocol ({exc})", guilty=exc.rid)

    # -- requests ---------------------------------------------------------------------------
    def post(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """A request that gets no reply (``new``, ``drop``)."""
        self._write(frames.encode(header, payload))

    async def request(self, header: dict[str, Any], timeout_s: float, payload: bytes = b"",
                      *, cap: int = 0, answer_cap: int | None = None
                      ) -> tuple[dict[str, Any], bytes]:
        """Send one request and wait for its reply; WorkerLost if the worker is (or goes) away,
        or misses the deadline (then it is killed: what it was doing can no longer be trusted).
        ``cap``: payload bytes the reply may carry (``answer_cap`` of them its answer proper,
        default all); a reply over either kills the worker, this request guilty."""
        if self.lost is not None:
            raise WorkerLost(self.lost)
        rid = next(self._rids)
        loop = asyncio.get_running_loop()
        flight = _Flight(loop.create_future(), cap, cap if answer_cap is None else answer_cap,
                         time.monotonic() + timeout_s)
        if not self._flights:
            self._busy_from = time.monotonic()
        self._flights[rid] = flight
        try:
            self._write(frames.encode(dict(header, id=rid), payload))
            async with asyncio.timeout(timeout_s):
                return await flight.future
        except TimeoutError:
            self.kill(f"a request ran past its {timeout_s:g} s deadline")
            raise WorkerLost(self.lost or "killed", SUSPECT) from None
        except asyncio.CancelledError:
            # The caller went away (a client hung up, Serve cancelled its request): the worker
            # still answers, once, and that answer is expected, not a forgery.
            if rid in self._flights:
                flight.future = None
                self._abandoned[rid] = None
                while len(self._abandoned) > MAX_ABANDONED:
                    self._landed(next(iter(self._abandoned)))
            raise
        finally:
            if flight.future is not None:
                self._landed(rid)

    def _landed(self, rid: int) -> _Flight | None:
        """Forget a request (answered, failed, or given up on)."""
        flight = self._flights.pop(rid, None)
        self._abandoned.pop(rid, None)
        if flight is not None and not self._flights:
            self._busy_s += time.monotonic() - self._busy_from
        return flight

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

    def _admit(self, header: dict[str, Any], size: int) -> None:
        """A reply's header, before its payload is read: it must answer a request in flight,
        within that request's caps (FrameError otherwise: the worker is killed)."""
        rid = header.get("id")
        flight = self._flights.get(rid) if type(rid) is int else None
        if flight is None:  # a reply to nothing the front asked, or a second one
            raise frames.FrameError(f"answered a request it was never sent (id {rid!r})")
        answer = header.get("rlen", size)
        if size > flight.cap or type(answer) is not int or not 0 <= answer <= size \
                or answer > flight.answer_cap:
            raise frames.FrameError(
                f"answered {size} bytes ({answer!r} of answer) to a request whose answer may "
                f"carry {flight.cap} ({flight.answer_cap} of answer)", rid=rid)

    def _on_reply(self, header: dict[str, Any], payload: bytes) -> None:
        flight = self._landed(header["id"])  # admitted: in flight until now
        if flight is None or flight.future is None:
            return  # the answer to a request whose caller went away
        if header.get("drain"):
            self.draining = True
        if not flight.future.done():
            flight.future.set_result((header, payload))

    def overdue(self) -> bool:
        """Whether a request whose caller went away is past its deadline unanswered (the
        caller's own deadline no longer watches it)."""
        now = time.monotonic()
        return any(now > self._flights[rid].deadline for rid in self._abandoned
                   if rid in self._flights)

    def busy_seconds(self) -> float:
        """Seconds so far with a request in flight."""
        return self._busy_s + (time.monotonic() - self._busy_from if self._flights else 0.0)

    def cpu_seconds(self) -> float | None:
        """CPU time its threads used (one read of ``/proc/<pid>/stat``); None if it is gone."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return None
        fields = stat[stat.rfind(b")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def runnable_seconds(self) -> float | None:
        """Seconds its threads were runnable: on a CPU or waiting for one (a thread spinning on
        a contended host counts fully); None if it is gone or the kernel keeps no schedstat."""
        root = f"/proc/{self.pid}/task"
        try:
            tids = os.listdir(root)
        except OSError:
            return None
        total, read = 0, 0
        for tid in tids:
            try:
                with open(f"{root}/{tid}/schedstat", "rb") as f:
                    ran, waited, _ = f.read().split()
            except (OSError, ValueError):  # a thread that ended meanwhile
                continue
            total += int(ran) + int(waited)
            read += 1
        return total / 1e9 if read else None

    def _on_eof(self) -> None:
        if self.lost is None:
            code = self.proc.poll()
            if code is None:
                try:
                    code = self.proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    code = None
            self._mark_lost(exit_reason(code))
        self.kill(self.lost)

    def _mark_lost(self, reason: str, guilty: int | None = None) -> None:
        if self.lost is not None:
            return
        self.lost = f"env worker {self.pid} {reason}"
        for rid, flight in self._flights.items():
            if flight.future is not None and not flight.future.done():
                verdict = (GUILTY if rid == guilty else SUSPECT if guilty is None
                           else INNOCENT)
                flight.future.set_exception(WorkerLost(self.lost, verdict))
        if self.on_lost is not None and self._loop is not None and not self._loop.is_closed():
            if _running_loop() is self._loop:
                self._loop.call_soon(self.on_lost, self)
            else:
                self._loop.call_soon_threadsafe(self.on_lost, self)

    # -- ending -----------------------------------------------------------------------------
    def kill(self, reason: str | None = None, guilty: int | None = None) -> None:
        """SIGKILL the worker (idempotent); every pending and later request gets WorkerLost.
        ``guilty``: the request whose answer broke the rules, if one did."""
        self._mark_lost(reason or "was stopped by the front", guilty)
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
        if self.proc.stderr is not None:
            loop.remove_reader(self.proc.stderr.fileno())
        self._reaper()  # waits for it, closes the pipes

    def alive(self) -> bool:
        return self.lost is None and self.proc.poll() is None
