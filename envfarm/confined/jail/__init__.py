"""Kernel confinement for processes that run generated code; no root needed.

``enter(policy)`` is called once inside a child process, before it reads any untrusted input,
and cannot be undone: it closes every descriptor not kept, empties the environment, gives the
process its own session, switches a root process to an unprivileged uid (see ``_identity``;
``policy.keep_imports`` keeps lazy imports working after, see ``_imports``), arms death with
its parent, sets rlimits (threads too, for a uid of its own), drops capabilities, sets
no_new_privs, then applies Landlock (read-only access to the Python installation, ``sys.path``
and ``policy.read_paths``; no writes; no TCP; no signals or abstract unix sockets beyond its own
domain) and a seccomp filter (see ``_seccomp``). Calling it again, e.g. in a child forked from a
jailed zygote, stacks a tighter layer; ``prepare(policy)`` in the zygote makes that layer once,
so that each child's ``PreparedJail.enter`` costs a few syscalls. ``support()`` says what this
kernel has.
"""

from __future__ import annotations

import functools
import math
import os
import resource
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from envfarm.confined.jail import _identity, _imports, _landlock, _process, _seccomp
from envfarm.confined.jail._identity import WorkerIdentity, uid_from_config, worker_identity

__all__ = ["JailError", "JailPolicy", "JailSupport", "OpenedRoots", "PreparedJail", "WorkerIdentity",
           "apply_ruleset", "enter", "open_roots", "prepare", "read_ruleset", "readable_roots",
           "restrict_reads", "seccomp_filter", "support", "switch_identity", "uid_from_config",
           "worker_identity"]


class JailError(RuntimeError):
    """A confinement layer the policy needs cannot be applied (``layer`` names it)."""

    def __init__(self, message: str, layer: str) -> None:
        super().__init__(message)
        self.layer = layer


@dataclass(frozen=True)
class JailPolicy:
    """What a jailed process may still do."""

    read_paths: tuple[str, ...] = ()   # extra readable trees (the Python installation, sys.path
                                       # entries and imported packages are always readable)
    memory_mb: int | None = 1024       # RLIMIT_AS
    cpu_s: float | None = None         # RLIMIT_CPU (whole process, from now)
    max_open_files: int = 64           # RLIMIT_NOFILE
    threads: bool = True               # allow clone(CLONE_THREAD)
    processes: bool = False            # allow fork/clone of processes (a zygote)
    min_landlock_abi: int = 1          # 0: run without Landlock where the kernel lacks it
    require_seccomp: bool = True       # False: run without seccomp where the kernel lacks it
    parent_pid: int | None = None      # the parent to die with (default: the current parent)
    new_session: bool = True           # setsid; False: only a process group of its own (cheaper)
    uid: int | None = None             # started as root: switch to this uid (and gid), no groups
    max_threads: int | None = None     # RLIMIT_NPROC once switched to ``uid`` (a uid of its own)
    keep_imports: bool = False         # switching uid: keep importing lazily from sys.path


@dataclass(frozen=True)
class JailSupport:
    """What this kernel offers for confinement."""

    seccomp: bool
    landlock_abi: int

    @property
    def ok(self) -> bool:
        """Both layers exist (the default policy can be applied)."""
        return self.seccomp and self.landlock_abi >= 1

    def describe(self) -> str:
        ll = "no landlock" if not self.landlock_abi else (
            f"landlock ABI {self.landlock_abi} (files"
            + (", tcp" if self.landlock_abi >= 4 else "")
            + (", signal/abstract-socket scopes" if self.landlock_abi >= 6 else "") + ")")
        return f"{'seccomp' if self.seccomp else 'no seccomp'}, {ll}"


@functools.cache
def support() -> JailSupport:
    """Probe this kernel once (cached; a forked child inherits the answer)."""
    return JailSupport(seccomp=_seccomp.available(), landlock_abi=_landlock.abi_version())


#: The dynamic loader's search path and cache: a lazily imported C extension (``_sqlite3``) loads
#: its system libraries (``libsqlite3.so``) from here. System libraries only, no data.
SYSTEM_LIBRARIES = ("/etc/ld.so.cache", "/lib", "/lib64", "/usr/lib", "/usr/lib64",
                    "/usr/local/lib")


def readable_roots(extra: Sequence[str] = ()) -> list[str]:
    """The trees a jailed process may read: the Python installation, real ``sys.path`` folders,
    the folders of imported packages (editable installs live elsewhere), the system's shared
    libraries, and ``extra``."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *SYSTEM_LIBRARIES, *extra}
    roots.update(p for p in sys.path if p not in ("", ".") and os.path.isabs(p))
    for module in list(sys.modules.values()):
        for path in getattr(module, "__path__", None) or ():
            if isinstance(path, str) and os.path.isabs(path):
                roots.add(path)
    out = {os.path.realpath(p) for p in roots if os.path.exists(p)}
    out.discard("/")  # a sys.path entry of "/" must not open the whole machine
    kept: list[str] = []
    for path in sorted(out):  # a folder sorts before what is in it, which it already grants
        if not kept or not path.startswith(kept[-1] + "/"):
            kept.append(path)
    return kept


_ENTERED_ROOTS: list[str] | None = None  # set by the first enter(); a fork inherits it


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # /proc out of reach (a jailed zygote's child): ask threading, if loaded
        threading = sys.modules.get("threading")
        return threading is None or threading.active_count() == 1


def _check(policy: JailPolicy) -> JailSupport:
    have = support()
    if policy.require_seccomp and not have.seccomp:
        raise JailError("this kernel has no seccomp filters", layer="seccomp")
    if policy.min_landlock_abi > have.landlock_abi:
        raise JailError(f"the policy needs Landlock ABI {policy.min_landlock_abi}, "
                        f"this kernel has {have.landlock_abi or 'none'}", layer="landlock")
    if not _single_threaded():
        # Landlock confines the calling thread only; other threads would stay free.
        raise JailError("entering the jail needs a single-threaded process", layer="threads")
    return have


def _switches_uid(policy: JailPolicy) -> bool:
    return policy.uid is not None and os.geteuid() == 0


def _pin_imports(policy: JailPolicy) -> list[int]:
    """Descriptors that keep lazy imports working after the uid switch (before it: as root)."""
    if not (policy.keep_imports and _switches_uid(policy)):
        return []
    try:
        return _imports.pin()
    except OSError as exc:
        raise JailError(f"cannot pin the import folders: {exc}", layer="identity") from exc


def _process_steps(policy: JailPolicy, keep_fds: Sequence[int]) -> None:
    switch = _switches_uid(policy)
    try:
        _process.close_fds_except(keep_fds)
        os.environ.clear()
        _process.own_session(policy.new_session)
    except OSError as exc:
        raise JailError(f"cannot confine the process: {exc}", layer="process") from exc
    if switch:
        try:
            _identity.switch(policy.uid)
        except OSError as exc:
            raise JailError(f"cannot switch to uid {policy.uid}: {exc}",
                            layer="identity") from exc
    try:
        # After the switch: a change of credentials clears the parent-death signal.
        _process.die_with_parent(policy.parent_pid)
        _process.set_limits(policy.memory_mb, policy.cpu_s, policy.max_open_files,
                            policy.max_threads if switch else None)
        _process.drop_capabilities()
        _process.no_new_privs()
    except OSError as exc:
        raise JailError(f"cannot confine the process: {exc}", layer="process") from exc


def _roots(policy: JailPolicy) -> list[str]:
    # Entering again (a zygote's child) stacks a layer: the first layer's roots bound it anyway.
    return readable_roots(policy.read_paths) if _ENTERED_ROOTS is None else _ENTERED_ROOTS


def _ruleset(roots: list[str], have: JailSupport) -> int | None:
    if not have.landlock_abi:
        return None
    try:
        return _landlock.read_only_ruleset(roots, have.landlock_abi)
    except OSError as exc:
        raise JailError(f"landlock failed: {exc}", layer="landlock") from exc


def seccomp_filter(policy: JailPolicy, pid: int | None = None, *, stacked: bool = False) -> bytes:
    """The seccomp program of ``policy``, compiled here for a process that should not load
    libseccomp itself (a verifier zygote), to pass to its ``enter`` or ``prepare``. ``pid``: the
    one process it may signal (None: none); ``stacked``: a layer over an earlier one (what
    ``prepare`` makes in a jailed zygote for its children)."""
    return _seccomp.program(pid, policy.threads, policy.processes, first=not stacked)


def enter(policy: JailPolicy, keep_fds: Sequence[int] = (0, 1, 2),
          compiled: bytes | None = None) -> JailSupport:
    """Confine this process, irreversibly; see the module docstring. Raises ``JailError``
    before changing anything when the kernel lacks a layer the policy needs. ``compiled``:
    the policy's ``seccomp_filter``, made elsewhere."""
    global _ENTERED_ROOTS
    have = _check(policy)
    roots = _roots(policy) if have.landlock_abi else []
    bpf = None
    if have.seccomp:
        bpf = compiled if compiled is not None else _seccomp.program(
            os.getpid(), policy.threads, policy.processes, first=_ENTERED_ROOTS is None)
    # Made before the uid switch: the unprivileged uid may not reach every root to name it.
    ruleset = _ruleset(roots, have)
    kept = (*keep_fds, *_pin_imports(policy), *([ruleset] if ruleset is not None else []))
    _process_steps(policy, kept)
    if ruleset is not None:
        try:
            _landlock.restrict_self(ruleset)
            os.close(ruleset)
        except OSError as exc:
            raise JailError(f"landlock failed: {exc}", layer="landlock") from exc
    if bpf is not None:
        try:
            _seccomp.load_bpf(bpf)
        except OSError as exc:
            raise JailError(f"seccomp failed: {exc}", layer="seccomp") from exc
    _ENTERED_ROOTS = roots
    return have


class _StackedLayer:
    """What a child of a jailed process (a zygote) does to stack a prepared layer, bound in
    that process once: a child inherits its limits and knows its parent, so everything that
    depends on them is worked out before the child exists, and the child runs it without
    wrappers, lookups or ctypes objects made on the way (each object a fresh child touches
    is a page it copies). The same steps, limits and order as the generic path."""

    def __init__(self, policy: JailPolicy, ruleset: int | None,
                 flt: _seccomp.Filter | None) -> None:
        lowered = _process.lowered
        self._new_session = policy.new_session
        self._parent = os.getpid() if policy.parent_pid is None else policy.parent_pid
        self._memory = None if policy.memory_mb is None else lowered(
            resource.RLIMIT_AS, policy.memory_mb << 20)
        self._cpu_s = policy.cpu_s
        self._cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        self._files = lowered(resource.RLIMIT_NOFILE, policy.max_open_files)
        self._arm_pdeathsig = _process.pdeathsig_arm()
        self._ruleset = ruleset
        self._filter = flt

    def enter(self, keep_fds: Sequence[int], cpu_s: float | None, ruleset: int | None) -> None:
        # One function, few calls: each function a child runs is two more pages it copies.
        rulesets = (self._ruleset, ruleset)
        cpu_s = self._cpu_s if cpu_s is None else cpu_s
        try:
            low = 0
            for fd in sorted({*keep_fds, *rulesets} - {None}):
                if fd > low:
                    os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, 1 << 30)
            if self._new_session:
                _process.own_session(True)
            else:  # a zygote's child: not a session leader, not yet a group leader
                os.setpgid(0, 0)
            self._arm_pdeathsig()
            if os.getppid() != self._parent:  # it died before the signal was armed
                os.kill(os.getpid(), signal.SIGKILL)
            if self._memory is not None:
                resource.setrlimit(resource.RLIMIT_AS, self._memory)
            if cpu_s is not None:  # from now, as tighten_limits
                ru = resource.getrusage(resource.RUSAGE_SELF)
                soft = math.ceil(ru.ru_utime + ru.ru_stime + cpu_s)
                hard = soft + 1 if self._cpu_hard == resource.RLIM_INFINITY else min(
                    soft + 1, self._cpu_hard)  # SIGXCPU, then SIGKILL a second later
                resource.setrlimit(resource.RLIMIT_CPU, (min(soft, hard), hard))
            resource.setrlimit(resource.RLIMIT_NOFILE, self._files)
        except OSError as exc:
            raise JailError(f"cannot confine the process: {exc}", layer="process") from exc
        try:
            for fd in rulesets:
                if fd is not None:
                    _landlock.restrict_self(fd)
                    os.close(fd)
        except OSError as exc:
            raise JailError(f"landlock failed: {exc}", layer="landlock") from exc
        try:
            if self._filter is not None:
                self._filter.load()
        except OSError as exc:
            raise JailError(f"seccomp failed: {exc}", layer="seccomp") from exc


@dataclass(frozen=True)
class PreparedJail:
    """A jail made ready once in a parent (a zygote) and entered by each child it forks, for
    a fraction of ``enter``'s cost: the Landlock ruleset and the compiled seccomp program are
    made in the parent and inherited. Made before the child's pid is known, its filter allows
    no signals at all, not even to the process itself."""

    policy: JailPolicy
    have: JailSupport
    roots: list[str]
    ruleset_fd: int | None
    bpf: bytes | None
    #: Prepared in a jailed process (no uid to switch): see ``enter``.
    stacked: bool = False
    filter: _seccomp.Filter | None = None
    #: A stacked layer's steps, bound in the process that prepared it (see ``_StackedLayer``).
    layer: _StackedLayer | None = None

    def enter(self, keep_fds: Sequence[int] = (0, 1, 2), cpu_s: float | None = None,
              ruleset: int | None = None) -> JailSupport:
        """Confine this process, forked from the one that prepared it (so it has one thread);
        as ``enter``, irreversible. ``cpu_s``: this child's CPU limit, instead of the policy's.
        ``ruleset``: a ``read_ruleset`` descriptor (kept open until then) to stack too, and
        close. A child of a jailed process inherits its empty environment, capabilities (none),
        no_new_privs, core and file-size limits: a stacked layer sets only the rest."""
        if self.layer is not None:
            self.layer.enter(keep_fds, cpu_s, ruleset)
            return self.have
        global _ENTERED_ROOTS
        kept = [fd for fd in (self.ruleset_fd, ruleset) if fd is not None]
        if self.stacked:
            self._tighten((*keep_fds, *kept), cpu_s)
        else:
            policy = self.policy if cpu_s is None else replace(self.policy, cpu_s=cpu_s)
            _check(policy)
            _process_steps(policy, (*keep_fds, *_pin_imports(policy), *kept))
        try:
            if self.ruleset_fd is not None:
                _landlock.restrict_self(self.ruleset_fd)
                os.close(self.ruleset_fd)
        except OSError as exc:
            raise JailError(f"landlock failed: {exc}", layer="landlock") from exc
        if ruleset is not None:
            apply_ruleset(ruleset)
        try:
            if self.filter is not None:
                self.filter.load()
        except OSError as exc:
            raise JailError(f"seccomp failed: {exc}", layer="seccomp") from exc
        _ENTERED_ROOTS = self.roots
        return self.have

    def _tighten(self, keep_fds: Sequence[int], cpu_s: float | None) -> None:
        policy = self.policy
        try:
            _process.close_fds_except(keep_fds)
            _process.own_session(policy.new_session)
            _process.die_with_parent(policy.parent_pid)
            _process.tighten_limits(policy.memory_mb, policy.cpu_s if cpu_s is None else cpu_s,
                                    policy.max_open_files)
        except OSError as exc:
            raise JailError(f"cannot confine the process: {exc}", layer="process") from exc


def prepare(policy: JailPolicy, compiled: bytes | None = None,
            landlock: bool = True) -> PreparedJail:
    """Make ``policy`` ready to enter in children forked from here (see ``PreparedJail``);
    ``compiled``: its ``seccomp_filter`` (pid None), made elsewhere. ``landlock=False``: no
    Landlock layer of its own, for children that stack theirs (``restrict_reads``) before
    they run anything they do not trust."""
    have = _check(policy)
    roots = _roots(policy) if have.landlock_abi else []
    ruleset = _ruleset(roots, have) if landlock else None
    bpf = None
    if have.seccomp:
        bpf = compiled if compiled is not None else _seccomp.program(
            None, policy.threads, policy.processes, first=_ENTERED_ROOTS is None)
    stacked = _ENTERED_ROOTS is not None and not _switches_uid(policy) and not policy.keep_imports
    flt = _seccomp.Filter(bpf) if bpf is not None else None
    return PreparedJail(policy, have, roots, ruleset, bpf, stacked, flt,
                        _StackedLayer(policy, ruleset, flt) if stacked else None)


def switch_identity(policy: JailPolicy) -> None:
    """Only the uid switch of ``enter`` (with its import pins and thread limit), for a process
    that runs unconfined (a kernel without seccomp or Landlock): no privilege is kept there
    either. No-op unless root with ``policy.uid`` set."""
    if not _switches_uid(policy):
        return
    _pin_imports(policy)
    try:
        _identity.switch(policy.uid)
        if policy.max_threads is not None:
            _process.limit_tasks(policy.max_threads)
    except OSError as exc:
        raise JailError(f"cannot switch to uid {policy.uid}: {exc}", layer="identity") from exc


@dataclass(frozen=True)
class OpenedRoots:
    """Readable trees opened once (``open_roots``: in a zygote), so that each child's
    ``restrict_reads`` grants them without looking their paths up again. O_PATH descriptors:
    they read nothing themselves; a child closes them (``close``) before running anything."""

    fds: tuple[tuple[int, bool], ...]  # (descriptor, is a folder)
    #: Their Landlock rules, made once for ``read_ruleset`` (None without Landlock).
    rules: _landlock.ReadRules | None = None

    def close(self) -> None:
        for fd, _ in self.fds:
            os.close(fd)


def open_roots(paths: Sequence[str]) -> OpenedRoots:
    """``paths`` opened for later ``restrict_reads`` and ``read_ruleset`` calls (those that
    exist)."""
    fds = tuple(_landlock.open_paths(paths))
    abi = support().landlock_abi
    return OpenedRoots(fds, _landlock.ReadRules(abi, fds) if abi else None)


def restrict_reads(paths: Sequence[str], opened: OpenedRoots | None = None) -> None:
    """Stack one more Landlock layer: from now on, reads only under ``paths`` and ``opened``
    (files or folders), within what earlier layers allowed. For what a process learns late,
    e.g. the two database files of the one verification a zygote's child runs. No-op without
    Landlock."""
    have = support()
    if not have.landlock_abi:
        return
    try:
        _landlock.restrict_read_only(list(paths), have.landlock_abi,
                                     opened.fds if opened is not None else ())
    except OSError as exc:
        raise JailError(f"landlock failed: {exc}", layer="landlock") from exc


def read_ruleset(paths: Sequence[str], opened: OpenedRoots | None = None) -> int | None:
    """The layer ``restrict_reads`` would stack, as a Landlock ruleset descriptor made here and
    applied by another process (``apply_ruleset``), e.g. a zygote's child that gets it with
    its job: the child then pays one syscall, not the ruleset's making. None without Landlock.
    The caller closes it once handed over."""
    have = support()
    if not have.landlock_abi:
        return None
    try:
        if opened is not None and opened.rules is not None:
            return opened.rules.ruleset(list(paths))
        return _landlock.read_only_ruleset(list(paths), have.landlock_abi,
                                           opened.fds if opened is not None else ())
    except OSError as exc:
        raise JailError(f"landlock failed: {exc}", layer="landlock") from exc


def apply_ruleset(ruleset: int) -> None:
    """Stack the layer of a ``read_ruleset`` descriptor on this process and close it."""
    try:
        _landlock.restrict_self(ruleset)
    except OSError as exc:
        raise JailError(f"landlock failed: {exc}", layer="landlock") from exc
    finally:
        os.close(ruleset)
