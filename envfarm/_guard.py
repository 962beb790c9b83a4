"""Defense in depth around generated env code: an audit hook and a timeout watchdog.

Threat model (also in the README): env code is untrusted LLM output, but it is *not* adversarial
by design: it is buggy. The guard stops the mistakes that would hurt the host or other leases:
network connections, spawning processes, writing files or env vars, opening other databases,
ctypes, long sleeps, and handlers that never return. It is not a security boundary against
deliberately malicious code (CPython cannot give one in-process); run the farm in a container
for that.
"""

from __future__ import annotations

import contextvars
import ctypes
import heapq
import itertools
import os
import sqlite3
import sys
import threading
import time
from contextlib import contextmanager
from collections.abc import Iterator

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_BLOCKED_EVENTS = {
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "os.remove", "os.rename", "os.rmdir",
    "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink", "os.truncate", "os.utime",
    "os.putenv", "os.unsetenv", "os.chdir", "shutil.copyfile", "shutil.copymode",
    "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.rmtree", "sqlite3.connect",
    "urllib.Request", "sys.addaudithook", "os.startfile", "webbrowser.open",
}
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "_ctypes.", "winreg.", "http.client.")


class SandboxViolation(PermissionError):
    """Env code tried something the guard forbids (network, processes, file writes, ...)."""


class CallTimeout(BaseException):
    """Raised inside env code that ran past its deadline.

    A BaseException so generated ``except Exception:`` blocks cannot swallow it.
    """


class CallGuard:
    """One tool call: its deadline, and which threads are running its code right now.

    The watchdog raises CallTimeout into those threads asynchronously, so the bookkeeping here
    is lock-free (an async exception landing inside ``with lock:`` can leak the lock) and relies
    on single dict operations being atomic under the GIL. The handshake: the watchdog sets
    ``_injecting`` before it reads ``_running`` and clears it after its last injection; a thread
    leaving env code first unregisters, then waits out ``_injecting``, then drains any exception
    aimed at it, so none can land in unrelated code after the call.
    """

    __slots__ = ("deadline", "conn", "_running", "_injected", "_injecting", "done", "fired")

    def __init__(self, timeout_s: float, conn: sqlite3.Connection | None) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.conn = conn
        self._running: dict[int, int] = {}
        self._injected: set[int] = set()
        self._injecting = False
        self.done = False
        self.fired = False

    def enter(self) -> None:
        """The current thread starts running this call's env code."""
        tid = threading.get_ident()
        if self.done and not self._running:
            # The caller gave up before this (sync, pool-queued) code even started.
            raise CallTimeout("env code started after its call timed out")
        self._running[tid] = self._running.get(tid, 0) + 1

    def exit(self) -> None:
        """The current thread stops running this call's env code (raises CallTimeout if hit)."""
        tid = threading.get_ident()
        depth = self._running.get(tid, 1) - 1
        if depth > 0:
            self._running[tid] = depth
            return
        while True:
            try:
                self._running.pop(tid, None)
                while self._injecting:
                    pass
                break
            except CallTimeout:
                continue
        if tid in self._injected:
            self._injected.discard(tid)
            _drain_async_exc(tid)
            raise CallTimeout("env code ran past its deadline")

    @contextmanager
    def running(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.exit()

    def fire(self) -> bool:
        """Interrupt the call: stop its SQLite work and raise CallTimeout in the threads running
        its code (also after the awaiting side gave up: a sync handler's thread may still spin).
        Returns False when no thread runs its code: an awaiting call is cancelled by asyncio."""
        self._injecting = True
        try:
            targets = list(self._running)
            for tid in targets:  # again on every fire: a bare `except:` may swallow one
                self._injected.add(tid)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid),
                                                           ctypes.py_object(CallTimeout))
        finally:
            self._injecting = False
        if not targets:
            return False
        self.fired = True
        if self.conn is not None:
            self.conn.interrupt()
        return True

    def finish(self) -> None:
        self.done = True

    @property
    def settled(self) -> bool:
        """The call returned and none of its code still runs anywhere."""
        return self.done and not self._running


def _drain_async_exc(tid: int) -> None:
    # The injected exception surfaces at the next eval-breaker check; give it one here, inside
    # the call, so it can never land in unrelated code after the call returned.
    try:
        for _ in range(1000):
            pass
    except CallTimeout:
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)


_current: contextvars.ContextVar[CallGuard | None] = contextvars.ContextVar(
    "envfarm_call_guard", default=None)


def current_guard() -> CallGuard | None:
    return _current.get()


@contextmanager
def guarded(guard: CallGuard) -> Iterator[None]:
    """Run a block as env code: the audit hook refuses forbidden actions, the watchdog times out."""
    install()
    token = _current.set(guard)
    _watchdog.watch(guard)
    try:
        yield
    finally:
        guard.finish()
        _current.reset(token)


@contextmanager
def restricted() -> Iterator[None]:
    """Audit-hook restrictions without a deadline (module import time of env code)."""
    with guarded(CallGuard(timeout_s=3600.0, conn=None)):
        yield


def _audit(event: str, args: tuple) -> None:
    guard = _current.get()
    if guard is None:
        return
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing:
            raise SandboxViolation(f"env code may not write files (tried to open {path!r})")
    elif event in _BLOCKED_EVENTS or event.startswith(_BLOCKED_PREFIXES):
        raise SandboxViolation(f"env code may not do {event!r} (network, processes, files and "
                               "other databases are off limits)")


def guarded_sleep(seconds: float) -> None:
    """``time.sleep`` for env code: a blocking sleep would stall every lease on the event loop."""
    if _current.get() is not None and seconds > 0.05:
        raise SandboxViolation(f"env code may not block in time.sleep({seconds})")
    time.sleep(seconds)


_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Install the process-wide audit hook once (it is inert outside guarded blocks)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if not _installed:
            sys.addaudithook(_audit)
            _installed = True


class _Watchdog:
    """One daemon thread that fires guards whose deadline passed while their code still runs."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, CallGuard]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, guard: CallGuard) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="envfarm-watchdog",
                                                daemon=True)
                self._thread.start()
            wake = not self._heap or guard.deadline < self._heap[0][0]
            heapq.heappush(self._heap, (guard.deadline, next(self._seq), guard))
            if wake:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, _, guard = self._heap[0]
                delay = deadline - time.monotonic()
                if delay > 0:
                    self._cond.wait(timeout=delay)
                    continue
                heapq.heappop(self._heap)
            fired = guard.fire()
            if not guard.settled:
                # Still running (the exception was swallowed), or not started yet (a sync handler
                # queued for a pool thread): look again soon.
                guard.deadline = time.monotonic() + (0.5 if fired else 0.05)
                self.watch(guard)


_watchdog = _Watchdog()
