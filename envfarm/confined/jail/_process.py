"""The process-level steps of entering the jail: descriptors, environment, session, death with
the parent, rlimits, capabilities, no_new_privs."""

from __future__ import annotations

import ctypes
import math
import os
import resource
import signal
from collections.abc import Sequence

_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 1, 38, 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, arg: int = 0) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def pdeathsig_arm():
    """``die_with_parent``'s prctl with its arguments made once, for the many children of one
    process (a zygote): in a fresh child, each object made is a page copied."""
    call, args = _libc.prctl, (_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)

    def arm() -> None:
        if call(*args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return arm


def close_fds_except(keep: Sequence[int]) -> None:
    low = 0
    for fd in sorted(set(keep)):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 30)  # close_range(2) underneath: one syscall


def own_session(new_session: bool = True) -> None:
    """Its own session (or only its own process group), so ``killpg`` by its parent reaches all
    of it and a terminal's signals do not. setsid costs 1-8 ms here (the scheduler's autogroup
    per session); a process group is 30 us, enough for a zygote's short-lived children."""
    if not new_session:
        if os.getpgid(0) != os.getpid():
            os.setpgid(0, 0)
        return
    if os.getsid(0) != os.getpid():
        try:
            os.setsid()
        except PermissionError:
            pass  # already a process-group leader: killpg reaches it as it is


def die_with_parent(parent_pid: int | None) -> None:
    expected = parent_pid if parent_pid is not None else os.getppid()
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != expected:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def _lower(which: int, soft: int, hard: int | None = None) -> None:
    """Set a limit, never above what is already there (a tightening ``enter`` cannot raise)."""
    _, cur_hard = resource.getrlimit(which)
    hard = soft if hard is None else hard
    if cur_hard != resource.RLIM_INFINITY:
        hard = min(hard, cur_hard)
    soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))


def limit_tasks(max_tasks: int) -> None:
    """RLIMIT_NPROC: the tasks (threads) its uid may have. Only meaningful for a uid of its own,
    and not root's (root is exempt). Soft equals hard: without CAP_SYS_RESOURCE nothing inside
    can raise it."""
    _lower(resource.RLIMIT_NPROC, max_tasks)


def set_limits(memory_mb: int | None, cpu_s: float | None, max_open_files: int,
               max_tasks: int | None = None) -> None:
    if max_tasks is not None:
        limit_tasks(max_tasks)
    tighten_limits(memory_mb, cpu_s, max_open_files)
    _lower(resource.RLIMIT_CORE, 0)
    _lower(resource.RLIMIT_FSIZE, 0)
    # A write that would grow a file fails with EFBIG instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def tighten_limits(memory_mb: int | None, cpu_s: float | None, max_open_files: int) -> None:
    """Memory, CPU time (from now) and open files: what a layer over a jail still sets."""
    if memory_mb is not None:
        _lower(resource.RLIMIT_AS, memory_mb << 20)
    if cpu_s is not None:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(ru.ru_utime + ru.ru_stime + cpu_s)
        _lower(resource.RLIMIT_CPU, soft, soft + 1)  # SIGXCPU, then SIGKILL a second later
    _lower(resource.RLIMIT_NOFILE, max_open_files)


def lowered(which: int, soft: int) -> tuple[int, int]:
    """What ``_lower(which, soft)`` would set, from this process's limits now."""
    cur_hard = resource.getrlimit(which)[1]
    hard = soft if cur_hard == resource.RLIM_INFINITY else min(soft, cur_hard)
    return min(soft, hard), hard


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_bounding_set() -> None:
    """Empty the capability bounding set and the ambient set (needs CAP_SETPCAP: root only)."""
    cap = 0
    while _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def drop_capabilities() -> None:
    """Lose every capability (raising rlimits, reading any file, ptrace, ...): a process still
    root keeps uid 0 without them; one that switched uid has none left already."""
    if os.geteuid() == 0:
        drop_bounding_set()
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def no_new_privs() -> None:
    prctl(_PR_SET_NO_NEW_PRIVS, 1)
