"""Process-wide patches that refuse, inside env code only, what the audit hook cannot see.

Python 3.11 raises no audit event for starting a thread, handing work to an executor, reading
``os.environ``, ``os._exit``, signal handlers, blocking waits or I/O on raw file descriptors.
Each patch below checks ``_guard.in_env_code()`` (a context-variable read, plus a dict lookup
only while some thread runs env code) and otherwise calls the real function, so host code pays
well under a microsecond. The real functions stay in closures, not in attributes env code could
reach by name (``functools.wraps`` would expose them as ``__wrapped__``).
"""

from __future__ import annotations

import _thread
import concurrent.futures
import gc
import os
import posix
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from envfarm.confined import _guard
from envfarm.confined._guard import SandboxViolation, in_env_code

#: Waits longer than this inside env code would stall the event loop (or a worker thread).
MAX_BLOCK_S = 0.05


def _refusing(real, what: str):
    """``real``, refused inside env code."""

    def refuse_in_env_code(*args, **kwargs):
        if in_env_code():
            raise SandboxViolation(f"env code may not {what}")
        return real(*args, **kwargs)

    refuse_in_env_code.__name__ = getattr(real, "__name__", "refused")
    refuse_in_env_code.__doc__ = getattr(real, "__doc__", None)
    return refuse_in_env_code


def _patch(owner, names: list[str], what: str) -> None:
    for name in names:
        real = getattr(owner, name, None)
        if real is not None:
            setattr(owner, name, _refusing(real, f"{what} ({name})"))


# -- threads and executors -----------------------------------------------------------------------
def _framework_thread(thread) -> bool:
    """FastAPI runs sync handlers on anyio worker threads; the work it hands them carries the
    call's context (so the guard follows it), and the call waits for that work to finish."""
    mod = sys.modules.get("anyio._backends._asyncio")
    worker = getattr(mod, "WorkerThread", None)
    return worker is not None and type(thread) is worker


def _patch_threads() -> None:
    start = _refusing(_thread.start_new_thread, "start threads (their work would escape the "
                      "call's guard, timeout and instance)")
    _thread.start_new_thread = start
    threading._start_new_thread = start  # what Thread.start calls
    real_start = threading.Thread.start

    def thread_start(self):
        if _framework_thread(self) and in_env_code():
            with _guard.host_code():  # starting it waits on an Event: not env code's wait
                return real_start(self)
        return real_start(self)

    threading.Thread.start = thread_start
    _patch(concurrent.futures.ThreadPoolExecutor, ["submit"], "hand work to a thread pool")
    _patch(concurrent.futures.ProcessPoolExecutor, ["submit"], "hand work to a process pool")
    _patch_handoffs()


def _patch_handoffs() -> None:
    """FastAPI and Starlette hand a call's sync code (handlers, dependencies, serializers) to
    anyio's thread pool. Before that code can run SQL on another thread, the call's connection
    is fenced again (``_sqlite_guard.Fence``: only the thread that lifted it may, and only then
    is nothing else stepping the connection), and it stays fenced until the work is back."""
    import anyio.to_thread

    real = anyio.to_thread.run_sync

    async def run_sync(func, *args, **kwargs):
        guard = _guard.active_guard()
        if guard is None:
            return await real(func, *args, **kwargs)
        guard.handoffs += 1
        try:
            if guard.fence is not None:
                guard.fence.end_lift()
            return await real(func, *args, **kwargs)
        finally:
            guard.handoffs -= 1

    run_sync.__name__, run_sync.__doc__ = real.__name__, real.__doc__
    anyio.to_thread.run_sync = run_sync


# -- processes, signals, file descriptors -----------------------------------------------------
def _patch_process_control() -> None:
    import _posixsubprocess
    import faulthandler
    import subprocess

    fork_exec = _refusing(_posixsubprocess.fork_exec, "start processes (fork_exec)")
    _posixsubprocess.fork_exec = fork_exec
    if getattr(subprocess, "_fork_exec", None) is not None:
        subprocess._fork_exec = fork_exec
    _patch(os, ["_exit", "abort", "kill", "killpg", "setsid", "setpgid", "setuid", "setgid"],
           "end or change the host process")
    _patch(signal, ["signal", "raise_signal", "alarm", "setitimer", "pause", "siginterrupt",
                    "set_wakeup_fd", "pthread_sigmask", "sigwait", "sigtimedwait",
                    "sigwaitinfo"], "touch the host's signals")
    _patch(faulthandler, [n for n in dir(faulthandler) if n.startswith("_") and
                          not n.startswith("__")] + ["enable", "disable", "register",
                                                     "dump_traceback_later"],
           "crash or instrument the host")
    # Raw descriptors belong to the host (its sockets, pipes and files): no audit event guards
    # them, and env code has no descriptors of its own (it may not open files).
    _patch(os, ["read", "write", "pread", "pwrite", "readv", "writev", "close", "closerange",
                "dup", "dup2", "ftruncate", "lseek", "sendfile", "fsync", "fdatasync", "pipe",
                "pipe2", "set_blocking", "set_inheritable", "fdopen"],
           "use the host's file descriptors")


# -- blocking waits ---------------------------------------------------------------------------
def _bounded_wait(real, what: str, timeout_index: int, timeout_name: str):
    """``real``, refused inside env code when it may block longer than MAX_BLOCK_S."""

    def wait(*args, **kwargs):
        if in_env_code() and not _collecting.active:
            timeout = kwargs.get(timeout_name, args[timeout_index] if len(args) > timeout_index
                                 else None)
            if timeout is None or timeout < 0 or timeout > MAX_BLOCK_S:
                raise SandboxViolation(f"env code may not block in {what} (timeout={timeout}): "
                                       "it would stall other leases and outlast the call timeout")
        return real(*args, **kwargs)

    wait.__name__ = getattr(real, "__name__", "wait")
    return wait


class _Collecting(threading.local):
    active = False


# The cyclic collector runs host finalizers in whichever thread allocates, env code included:
# grpc's channel dealloc (Ray) joins its poller thread with a 0.2 s timeout. Waits inside a
# collection are the host's; env code can at worst stall the loop that way (a finalizer of its
# own), which README lists with the CPU-burn cases as not confined.
_collecting = _Collecting()


def _on_gc(phase: str, _info: dict) -> None:
    _collecting.active = phase == "start"


def _join(real):
    bounded = _bounded_wait(real, "threading.Thread.join", 1, "timeout")

    def join(self, *args, **kwargs):
        if not self.is_alive():  # a finished thread's join returns at once: nothing to stall
            return real(self, *args, **kwargs)
        return bounded(self, *args, **kwargs)

    return join


def _patch_blocking() -> None:
    # Condition.wait backs Event.wait, Semaphore.acquire, Barrier.wait and queue.Queue.get/put.
    threading.Condition.wait = _bounded_wait(threading.Condition.wait,
                                             "threading.Condition.wait", 1, "timeout")
    threading.Thread.join = _join(threading.Thread.join)
    gc.callbacks.append(_on_gc)
    select.select = _bounded_wait(select.select, "select.select", 3, "timeout")
    time.sleep = _guard.guarded_sleep


# -- environment variables --------------------------------------------------------------------
def _host_environ(env: os._Environ) -> os._Environ:
    """``os.environ`` (or ``environb``) that is empty as seen from env code: ``os.getenv`` gives
    the default. The host process holds API keys; generated code reads ``DATABASE_PATH`` at
    most, falls back to its default, and the binding ignores the URL anyway."""
    data = env._data  # shared with the original object: both stay in sync

    def hidden(self):
        if in_env_code():
            raise SandboxViolation("env code may not read the host's environment variables")
        return data

    class HostEnviron(type(env)):
        _data = property(hidden, lambda self, value: None)  # set once by __init__, to `data`

        def __getitem__(self, key):
            if in_env_code():
                raise KeyError(key)
            return super().__getitem__(key)

        def __iter__(self):
            if in_env_code():
                return iter(())
            return super().__iter__()

        def __len__(self):
            if in_env_code():
                return 0
            return super().__len__()

        def copy(self):
            return {} if in_env_code() else super().copy()

    HostEnviron.__name__ = HostEnviron.__qualname__ = "_Environ"
    return HostEnviron(data, env.encodekey, env.decodekey, env.encodevalue, env.decodevalue)


def _startup_environ(data: dict) -> Mapping:
    """``posix.environ`` (the environment at startup, as bytes), refused to env code."""

    def get() -> dict:
        if in_env_code():
            raise SandboxViolation("env code may not read the host's environment variables")
        return data

    class StartupEnviron(Mapping):
        __slots__ = ()

        def __getitem__(self, key):
            return get()[key]

        def __iter__(self):
            return iter(get())

        def __len__(self):
            return len(get())

    return StartupEnviron()


def _patch_environ() -> None:
    for name in ("environ", "environb"):
        env = getattr(os, name, None)
        if env is not None and type(env) is os._Environ:
            setattr(os, name, _host_environ(env))
    if isinstance(getattr(posix, "environ", None), dict):
        posix.environ = _startup_environ(posix.environ)


def patch_process() -> None:
    """Apply every patch once (``install`` calls this)."""
    _patch_threads()
    _patch_process_control()
    _patch_blocking()
    _patch_environ()


_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Install the process-wide patches and audit hook once (inert outside env code)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if not _installed:
            patch_process()
            _guard.start_auditing()
            _installed = True


@contextmanager
def guarded(guard: _guard.CallGuard) -> Iterator[None]:
    """Run a block as env code: the audit hook and the patches refuse forbidden actions, the
    watchdog times out."""
    install()
    with _guard.as_env_code(guard):
        yield


@contextmanager
def restricted() -> Iterator[None]:
    """Audit-hook restrictions without a deadline (module import time of env code)."""
    guard = _guard.CallGuard(timeout_s=3600.0, conn=None)
    with guarded(guard), guard.running():
        yield
