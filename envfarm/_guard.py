"""Confinement of generated env code inside the serving process: what counts as env code, the
audit hook, and the timeout watchdog. Process-wide patches live in ``_confine``, SQLite's
authorizer in ``_sqlite_guard``.

Threat model (docs/security.md): env code is untrusted LLM output, buggy and sometimes
careless with the host (reads a file, spawns a thread, ATTACHes a database, calls sys.exit). The
guard refuses those, wherever the env code runs: the call's own coroutine steps, tasks it spawns,
and FastAPI's worker threads for sync handlers. It is not a security boundary against
deliberately malicious code (CPython cannot give one in-process: ctypes-free tricks such as
gc-walking still reach the real objects); run the farm in a container for that.

Env code is recognized two ways: a context variable (it follows the call into tasks and the
worker threads that copy the context) and a per-thread flag set while a thread runs one of the
call's steps (so code that runs itself in an empty ``contextvars.Context`` is still caught).
"""

from __future__ import annotations

import collections.abc
import contextvars
import ctypes
import heapq
import itertools
import os
import sqlite3
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_BLOCKED_EVENTS = {
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "os.remove", "os.rename", "os.rmdir",
    "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink", "os.truncate", "os.utime",
    "os.putenv", "os.unsetenv", "os.chdir", "shutil.copyfile", "shutil.copymode",
    "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.rmtree", "sqlite3.connect",
    "urllib.Request", "sys.addaudithook", "os.startfile", "webbrowser.open",
    # reading the host: directory listings, extended attributes
    "glob.glob", "os.getxattr", "os.listxattr", "os.setxattr",
    "os.removexattr", "os.chflags", "os.lockf",
    # reaching around the guard: loadable SQLite extensions, other threads' frames, all objects
    "sqlite3.enable_load_extension", "sqlite3.load_extension", "sys._current_frames",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
    "builtins.input", "signal.pthread_kill", "resource.setrlimit", "resource.prlimit",
}
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "_ctypes.", "winreg.", "http.client.", "mmap.")


class SandboxViolation(PermissionError):
    """Env code tried something the guard forbids (network, processes, file writes, ...)."""


class CallTimeout(BaseException):
    """Raised inside env code that ran past its deadline.

    A BaseException so generated ``except Exception:`` blocks cannot swallow it.
    """


class EnvCodeExit(Exception):
    """Env code raised SystemExit or KeyboardInterrupt: its call fails, the host carries on."""


#: thread id -> the guard whose code that thread is running right now (see ``CallGuard.enter``).
_env_threads: dict[int, CallGuard] = {}


class CallGuard:
    """One tool call: its deadline, which threads run its code, and the tasks it spawned.

    The watchdog raises CallTimeout into those threads asynchronously, so the bookkeeping here
    is lock-free (an async exception landing inside ``with lock:`` can leak the lock) and relies
    on single dict operations being atomic under the GIL. The handshake: the watchdog sets
    ``_injecting`` before it reads ``_running`` and clears it after its last injection; a thread
    leaving env code first unregisters, then waits out ``_injecting``, then drains any exception
    aimed at it, so none can land in unrelated code after the call.
    """

    __slots__ = ("deadline", "conn", "fence", "_running", "_injected", "_injecting", "done",
                 "fired", "tasks", "handoffs")

    def __init__(self, timeout_s: float, conn: sqlite3.Connection | None, fence=None) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.conn = conn
        #: ``conn``'s ``_sqlite_guard.Fence``, lifted during the call's steps when it may be.
        self.fence = fence
        self._running: dict[int, int] = {}
        self._injected: set[int] = set()
        self._injecting = False
        self.done = False
        self.fired = False
        self.tasks: list = []  # asyncio tasks that env code created during the call
        self.handoffs = 0  # pieces of its code running on a thread pool now (the fence stays)

    def enter(self) -> None:
        """The current thread starts running this call's env code.

        Call it inside the ``try`` whose ``finally`` calls ``exit``: the watchdog may raise into
        the thread as soon as it is registered, before ``enter`` returns."""
        tid = threading.get_ident()
        if self.done and not self._running:
            # The caller gave up before this (sync, pool-queued) code even started.
            raise CallTimeout("env code started after its call timed out")
        depth = self._running.get(tid, 0)
        self._running[tid] = depth + 1
        if depth == 0:
            _env_threads[tid] = self

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
                if _env_threads.get(tid) is self:
                    del _env_threads[tid]
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
        try:
            self.enter()
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
            try:
                self.conn.interrupt()
            except sqlite3.ProgrammingError:
                pass  # the instance was reset meanwhile: its old connection is closed
        return True

    def finish(self) -> None:
        self.done = True

    @property
    def settled(self) -> bool:
        """The call returned and none of its code still runs anywhere."""
        return self.done and not self._running

    async def stop_tasks(self, grace_s: float) -> int:
        """Cancel the tasks env code spawned and give them ``grace_s`` to unwind, inside the call.

        Returns how many are still alive; those never run another step (see ``Tracked``)."""
        import asyncio

        pending = [t for t in self.tasks if not t.done()]
        deadline = time.monotonic() + grace_s
        while pending and time.monotonic() < deadline:
            for task in pending:
                task.cancel()  # again each round: env code may swallow a cancellation
            await asyncio.wait(pending, timeout=min(0.02, max(0.0, deadline - time.monotonic())))
            pending = [t for t in pending if not t.done()]
        for task in self.tasks:  # nobody awaits these: mark their errors as seen
            task.add_done_callback(_retrieve)
        self.tasks.clear()
        return len(pending)


def _retrieve(task) -> None:
    if not task.cancelled():
        task.exception()


def _drain_async_exc(tid: int) -> None:
    # The injected exception surfaces at the next eval-breaker check; give it one here, inside
    # the call, so it can never land in unrelated code after the call returned.
    try:
        for _ in range(1000):
            pass
    except CallTimeout:
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)


class Tracked(collections.abc.Coroutine):
    """Await a coroutine while marking each of its steps as running env code of ``guard``.

    The timeout watchdog only interrupts a thread while it is inside such a step, so a busy loop
    is stopped without ever raising into unrelated code that shares the event loop. Used for the
    call itself and for every task its env code spawns: a spawned task's steps after the call
    ended are refused, and SystemExit from env code becomes an ordinary exception.
    """

    __slots__ = ("_coro", "_guard", "_spawned")

    def __init__(self, coro, guard: CallGuard, spawned: bool = False) -> None:
        self._coro = coro
        self._guard = guard
        self._spawned = spawned

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        return self._step(self._coro.send, value)

    def throw(self, *exc):
        return self._step(self._coro.throw, *exc)

    def _step(self, method, *args):
        guard = self._guard
        if self._spawned and guard.done:
            self._coro.close()
            raise CallTimeout("a task spawned by env code outlived its call")
        fence = guard.fence  # lifted before enter: no CallTimeout can land in between
        lifted = fence is not None and fence.lift(guard)
        try:
            guard.enter()
            return method(*args)
        except (SystemExit, KeyboardInterrupt) as exc:
            raise EnvCodeExit(f"env code raised {type(exc).__name__}({exc})") from None
        finally:
            try:
                guard.exit()
            finally:
                if lifted:
                    fence.end_lift()

    def close(self):
        self._coro.close()

    # asyncio and anyio inspect a task's coroutine (``inspect.getcoroutinestate``, repr).
    @property
    def cr_frame(self):
        return getattr(self._coro, "cr_frame", None)

    @property
    def cr_running(self):
        return getattr(self._coro, "cr_running", False)

    @property
    def cr_await(self):
        return getattr(self._coro, "cr_await", None)

    @property
    def cr_code(self):
        return getattr(self._coro, "cr_code", None)


_current: contextvars.ContextVar[CallGuard | None] = contextvars.ContextVar(
    "envfarm_call_guard", default=None)


def current_guard() -> CallGuard | None:
    return _current.get()


def active_guard() -> CallGuard | None:
    """The guard of the env code running here, by context or by thread (None in host code)."""
    guard = _current.get()
    if guard is None and _env_threads:
        guard = _env_threads.get(threading.get_ident())
    return guard


def in_env_code() -> bool:
    return _current.get() is not None or (
        bool(_env_threads) and threading.get_ident() in _env_threads)


@contextmanager
def guarded(guard: CallGuard) -> Iterator[None]:
    """Run a block as env code: the audit hook refuses forbidden actions, the watchdog times out."""
    install()
    _watchdog.watch(guard)  # may start the watchdog thread: not as env code
    token = _current.set(guard)
    try:
        yield
    finally:
        guard.finish()
        _current.reset(token)


@contextmanager
def host_code() -> Iterator[None]:
    """Run a block as host code although env code called it (starting a framework thread)."""
    tid = threading.get_ident()
    guard = _env_threads.pop(tid, None)
    token = _current.set(None)
    try:
        yield
    finally:
        _current.reset(token)
        if guard is not None:
            _env_threads[tid] = guard


def track_tasks(loop) -> None:
    """Make the tasks env code creates on ``loop`` part of its call (installed once per loop).

    A spawned task keeps the call's context (a ``context=`` argument is ignored), each of its
    steps is a ``Tracked`` step of the call, and ``CallGuard.stop_tasks`` cancels it at the end.
    """
    inner = loop.get_task_factory()
    if getattr(inner, "envfarm_tracks_tasks", False):
        return
    import asyncio

    def task_factory(loop, coro, **kwargs):
        guard = active_guard()
        if guard is None:
            if inner is not None:
                return inner(loop, coro, **kwargs)
            return asyncio.Task(coro, loop=loop, **kwargs)
        kwargs.pop("context", None)
        if guard.done:
            coro.close()
            raise SandboxViolation("env code may not start tasks after its call ended")
        coro = Tracked(coro, guard, spawned=True)
        task = inner(loop, coro, **kwargs) if inner is not None else asyncio.Task(
            coro, loop=loop, **kwargs)
        guard.tasks.append(task)
        return task

    task_factory.envfarm_tracks_tasks = True
    loop.set_task_factory(task_factory)


@contextmanager
def restricted() -> Iterator[None]:
    """Audit-hook restrictions without a deadline (module import time of env code)."""
    guard = CallGuard(timeout_s=3600.0, conn=None)
    with guarded(guard), guard.running():
        yield


_read_roots: tuple[str, ...] = ()


def _python_roots() -> tuple[str, ...]:
    """Folders env code may read from: the Python installation (lazy imports) and tz data."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages", "lib-dynload"))}
    try:
        import zoneinfo
        roots |= set(zoneinfo.TZPATH)
    except ImportError:
        pass
    roots |= {os.path.realpath(r) for r in roots}
    return tuple(os.path.join(r, "") for r in sorted(roots) if r)


def _may_read(path) -> bool:
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False  # an inherited file descriptor: the host's, not env code's
    real = os.path.join(os.path.realpath(os.fsdecode(path)), "")
    return real.startswith(_read_roots)


def _audit(event: str, args: tuple) -> None:
    if _current.get() is None and not (_env_threads and threading.get_ident() in _env_threads):
        return
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing:
            raise SandboxViolation(f"env code may not write files (tried to open {path!r})")
        if not _may_read(path):
            raise SandboxViolation(f"env code may not read host files (tried to open {path!r})")
    elif event in ("os.listdir", "os.scandir"):  # imports list the Python installation's folders
        if not _may_read(args[0] if args and args[0] is not None else "."):
            raise SandboxViolation(f"env code may not list host folders ({args[0]!r})")
    elif event in _BLOCKED_EVENTS or event.startswith(_BLOCKED_PREFIXES):
        raise SandboxViolation(f"env code may not do {event!r} (network, processes, host files, "
                               "threads and other databases are off limits)")


_real_sleep = time.sleep


def guarded_sleep(seconds: float) -> None:
    """``time.sleep`` for env code: a blocking sleep would stall every lease on the event loop."""
    if seconds > 0.05 and in_env_code():
        raise SandboxViolation(f"env code may not block in time.sleep({seconds})")
    _real_sleep(seconds)


_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Install the process-wide audit hook and patches once (inert outside env code)."""
    global _installed, _read_roots
    if _installed:
        return
    with _install_lock:
        if not _installed:
            from envfarm import _confine

            _read_roots = _python_roots()
            _confine.patch_process()
            sys.addaudithook(_audit)
            _installed = True


#: How late past its deadline the watchdog may fire a guard (it wakes at most once per tick).
WATCHDOG_TICK_S = 0.02


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
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    # At least a tick: with calls flowing, the next deadline is only 1/rate away,
                    # and waking per call costs the serving thread the GIL that many times.
                    self._cond.wait(timeout=max(delay, WATCHDOG_TICK_S))
                now = time.monotonic()
                due = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
            for guard in due:
                if guard.settled:
                    continue  # the common case: the call ended long ago
                fired = guard.fire()
                if not guard.settled:
                    # Still running (the exception was swallowed), or not started yet (a sync
                    # handler queued for a pool thread): look again soon.
                    guard.deadline = time.monotonic() + (0.5 if fired else 0.05)
                    self.watch(guard)


_watchdog = _Watchdog()
