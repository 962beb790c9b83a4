"""Who a jailed process runs as: never root.

A farm started as root (``make demo``, CI, most Ray and KubeRay containers) ran env code as uid 0.
Without capabilities, but still the owner of every root-owned file: Landlock does not govern
``chmod``, ``chown``, extended attributes, timestamps or file flags, so env code could make a root
binary setuid or a root-only secret world-readable. A jailed process started as root therefore
switches to an unprivileged uid and gid, with no supplementary groups, before it is confined.

Each process gets a uid of its own, ``UID_BASE`` + its pid: unique among the live processes of
its pid namespace with no bookkeeping (Serve replicas spawn workers independently), so
``RLIMIT_NPROC`` (which counts a uid's tasks) caps the threads of that one process, and no two
workers own the same processes. The range is one systemd leaves unused (1879048192-2147352575)
and that no host file is expected to belong to. Where the range is not mapped (a user namespace
of 65,536 ids), processes share ``nobody`` and threads are not capped per process. Where only
uid 0 is mapped (``unshare -rn``, how ``make demo`` runs for a user who is not root), there is no
uid to switch to and none to need: root there is that user outside, with no privilege. A
process that is not root has nothing to give up and keeps its uid.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from envfarm.jail import _process

UID_BASE = 0x7000_0000
NOBODY = 65534
_PID_MAX_LIMIT = 1 << 22  # the kernel's ceiling for pid_max on 64-bit


@dataclass(frozen=True)
class WorkerIdentity:
    """The uid a process that starts jailed processes hands them (computed once, in it)."""

    root: bool                 # this process is root: its jailed children switch away from it
    uid_base: int | None       # children take uid_base + their pid
    shared_uid: int | None     # or, where the range is not mapped, this one uid all share

    def config(self) -> dict[str, int]:
        """What a child's config carries (nothing when there is nothing to switch from)."""
        if self.uid_base is not None:
            return {"uid_base": self.uid_base}
        return {"uid": self.shared_uid} if self.shared_uid is not None else {}

    def describe(self) -> str:
        if not self.root:
            return f"uid {os.getuid()} like the farm (not root: nothing to drop)"
        if self.uid_base is not None:
            return "a uid of its own each"
        if self.shared_uid is None:
            return f"uid 0 like the farm (uid {_outside_uid()} outside this user namespace)"
        return f"uid {self.shared_uid}, shared (uids from {UID_BASE} are not mapped here)"

    def warning(self) -> str | None:
        """One log line where confinement is weaker than it is as root in a full user space."""
        if not self.root:
            return (f"env workers run as uid {os.getuid()} like the farm: it is not root, so "
                    "there is no privilege to drop and no uid of their own to cap their threads "
                    "with (seccomp still denies chmod, chown, xattrs, utime and file flags)")
        if self.shared_uid is None and self.uid_base is None:
            return (f"env workers keep uid 0 of this user namespace (uid {_outside_uid()} outside "
                    "it), which maps no other uid to switch to: no uid of their own caps their "
                    "threads (seccomp still denies chmod, chown, xattrs, utime and file flags)")
        if self.uid_base is None:
            return (f"env workers share uid {self.shared_uid}: uids {UID_BASE}.. are not mapped "
                    "in this user namespace, so their threads are not capped per worker")
        return None


def _uid_map() -> list[tuple[int, ...]]:
    """This user namespace's uid extents: (first uid inside, first uid outside, count)."""
    try:
        with open("/proc/self/uid_map") as fh:
            return [tuple(int(x) for x in line.split()) for line in fh if line.strip()]
    except OSError:
        return []


def _mapped(lo: int, count: int) -> bool:
    """Whether uids ``lo .. lo+count-1`` all exist in this user namespace."""
    return any(inside <= lo and lo + count <= inside + length
               for inside, _outside, length in _uid_map())


def _outside_uid() -> int | None:
    """The uid this namespace's uid 0 is outside it (None where 0 is not mapped)."""
    return next((outside for inside, outside, _ in _uid_map() if inside == 0), None)


@functools.cache
def worker_identity() -> WorkerIdentity:
    """How this process's jailed children switch uid (cached: a fork inherits the answer)."""
    if os.geteuid() != 0:
        return WorkerIdentity(root=False, uid_base=None, shared_uid=None)
    if _mapped(UID_BASE, _PID_MAX_LIMIT):
        return WorkerIdentity(root=True, uid_base=UID_BASE, shared_uid=None)
    if _mapped(NOBODY, 1):
        return WorkerIdentity(root=True, uid_base=None, shared_uid=NOBODY)
    return WorkerIdentity(root=True, uid_base=None, shared_uid=None)  # only uid 0 is mapped


def uid_from_config(config: dict) -> int | None:
    """The uid a child whose config came from ``WorkerIdentity.config`` switches to."""
    if config.get("uid_base") is not None:
        return int(config["uid_base"]) + os.getpid()
    return int(config["uid"]) if config.get("uid") is not None else None


def switch(uid: int) -> None:
    """Become ``uid``/``uid`` with no supplementary groups, for good (real, effective and saved
    ids, so nothing can switch back; the kernel clears every capability). Root only."""
    _process.drop_bounding_set()  # needs CAP_SETPCAP, which the switch takes away
    try:
        os.setgroups([])
    except PermissionError:
        if os.getgroups():  # a user namespace that forbids setgroups: only if none are left
            raise
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise PermissionError(f"switching to uid {uid} did not take")
