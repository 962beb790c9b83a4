"""Stopping a farm this process started: within a deadline, and with nothing left behind.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group, so Ray's own processes
(GCS, raylet, workers, HAProxy) would get it too and die under in-flight requests, leaving the
driver to wait on a Serve that is gone. ``shielded_start`` starts them with SIGINT ignored (a
disposition that survives exec, and that Python keeps), so only the driver hears Ctrl-C and
shuts Serve down in order: in-flight requests are answered, then Ray stops. ``stop_within``
bounds that (Serve's own shutdown first drains: in-flight requests are answered, new ones get
503, see ``RunningFarm.shutdown``), then ends whatever process the farm started that is still
alive (reparented away from us, an HAProxy left by a reload) by the handles taken while it
ran. A terminal's Ctrl-C during start-up is kept and acted on once the start finishes.

A process whose parent dies is handed to init, out of our sight: an HAProxy that Ray's proxy
started while Serve was shutting down outlived the farm once its parent was gone (CI, a SIGTERM
during the deploy). ``Descendants`` makes this process a child subreaper (``prctl``, no
privileges needed), so such orphans come to it, stay in sight, and are reaped.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psutil

log = logging.getLogger("cluster.serve")

T = TypeVar("T")


def shielded_start(start: Callable[[], T]) -> T:
    """Run ``start`` with SIGINT ignored, so the processes it spawns ignore a terminal's Ctrl-C.

    SIGINT is also blocked in this thread meanwhile: the kernel discards an ignored signal that
    is not blocked, so a Ctrl-C during the start would be lost (the farm then ran on, deaf).
    Blocked, it stays pending and reaches the handler restored after the start: install the one
    that should hear it (not one that raises) before calling this."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return start()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C meanwhile arrives now


_PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Make this process the one that receives its descendants' orphans (Linux); whether it
    worked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Descendants:
    """Every process below this one seen so far (psutil handles: a reused pid is not ours).
    This process becomes a subreaper (see the module docstring): orphans stay below it."""

    def __init__(self) -> None:
        self.seen: dict[int, psutil.Process] = {}
        self.adopting = adopt_orphans()
        self._own: set[int] | None = None  # children it started itself (Popen reaps those)

    def look(self) -> None:
        me = psutil.Process()
        for proc in me.children(recursive=True):
            self.seen.setdefault(proc.pid, proc)
        direct = me.children()
        if self._own is None:
            self._own = {p.pid for p in direct}
        if self.adopting:
            self._reap_orphans(direct)

    def _reap_orphans(self, direct: list[psutil.Process]) -> None:
        """Collect adopted orphans that ended (they would stay zombies of this process)."""
        for proc in direct:
            if proc.pid in (self._own or ()):
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(proc.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                continue

    def alive(self) -> list[psutil.Process]:
        out = []
        for proc in self.seen.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except psutil.Error:
                continue
        return out

    def end(self, grace_s: float = 2.0) -> list[str]:
        """SIGTERM every one still alive, SIGKILL after ``grace_s``; their names."""
        left = self.alive()
        names = []
        for proc in left:
            try:
                names.append(proc.name())
                proc.terminate()
            except psutil.Error:
                continue
        _, stubborn = psutil.wait_procs(left, timeout=grace_s)
        for proc in stubborn:
            try:
                proc.kill()
            except psutil.Error:
                continue
        return names


def stop_within(shutdown: Callable[[], None], watch: Descendants, deadline_s: float = 5.0
                ) -> tuple[list[str], bool]:
    """Run ``shutdown`` for at most ``deadline_s``, then end what is left: (names of what was
    left, whether ``shutdown`` finished). When it did not, Ray's exit hooks would wait on the
    processes just ended: the caller should leave with ``os._exit``."""
    watch.look()
    done = threading.Event()

    def run() -> None:
        try:
            shutdown()
        except Exception as exc:  # noqa: BLE001 - a half-dead Ray: the processes go below
            log.warning("farm shutdown failed: %s: %s", type(exc).__name__, exc)
        finally:
            done.set()

    threading.Thread(target=run, name="envfarm-stop", daemon=True).start()
    finished = done.wait(deadline_s)
    if not finished:
        log.warning("farm shutdown took over %.0f s; ending its processes", deadline_s)
    # What the shutdown itself started (a late HAProxy reload) comes to this process as an
    # orphan: end what is left until two looks in a row find nothing (at most ~3 s).
    left: list[str] = []
    quiet, until = 0, time.monotonic() + 3.0
    while quiet < 2 and time.monotonic() < until:
        watch.look()
        ended = watch.end(grace_s=1.5)
        left += ended
        quiet = 0 if ended else quiet + 1
        if quiet < 2:
            time.sleep(0.15)
    return left, finished
