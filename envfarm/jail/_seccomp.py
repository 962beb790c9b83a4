"""The seccomp filter: a deny list compiled by libseccomp (through ``pyseccomp``).

Default allow, because CPython and SQLite use a wide and changing set of syscalls; what is denied
is every door out of the process: new sockets, exec, new processes, other processes' memory and
signals, kernel surfaces that bypass seccomp (io_uring) or reach beyond the process (mount,
namespaces, bpf, keyrings, SysV IPC). Denials answer EPERM (so Python raises a typed
``PermissionError``); clone3 answers ENOSYS so glibc falls back to clone, whose flags seccomp can
read. Syscalls of another ABI (i386, x32) kill the process: libseccomp's bad-arch action.
"""

from __future__ import annotations

import ctypes
import errno
import os

import pyseccomp as sc

# Flags of clone(2) that make new namespaces; never allowed, even where processes are.
_CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
              0x40000000, 0x00000080)  # NS, CGROUP, UTS, IPC, USER, PID, NET, TIME
_CLONE_THREAD = 0x00010000
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C  # type into / control the terminal of whoever holds it

DENIED = (
    # the network (an inherited socket keeps working: only new ones are refused)
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    # running other programs
    "execve", "execveat",
    # other processes: their memory, descriptors, signals
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "process_madvise", "process_mrelease", "tkill", "ioprio_set",
    "migrate_pages", "move_pages",
    # io_uring runs its work where seccomp does not look
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # the kernel's shared surfaces: mounts, namespaces, bpf, keyrings, modules, clocks
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "bpf", "perf_event_open",
    "keyctl", "add_key", "request_key", "userfaultfd", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "quotactl_fd", "open_by_handle_at", "name_to_handle_at", "syslog", "ioperm",
    "iopl", "modify_ldt", "fanotify_init", "lookup_dcookie", "vhangup", "settimeofday",
    "clock_settime", "adjtimex", "clock_adjtime", "sethostname", "setdomainname", "uselib",
    "personality",
    # SysV and POSIX IPC objects are shared with every process of the same user
    "shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semctl", "semtimedop", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr",
)


def _rule(flt: sc.SyscallFilter, action: int, name: str, *args: sc.Arg) -> None:
    try:
        flt.add_rule(action, name, *args)
    except (OSError, ValueError):
        pass  # a syscall this libseccomp or this architecture does not have


def build(pid: int | None, threads: bool, processes: bool,
          first: bool = True) -> sc.SyscallFilter:
    """The filter for process ``pid`` (signals only to itself; ``None``: a filter made before
    the pid is known, which allows no signals at all). ``first=False``: a layer on top of one
    built here before (filters stack: only what tightens, or names the new pid, is needed)."""
    flt = sc.SyscallFilter(sc.ALLOW)
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for attr, value in ((sc.Attr.CTL_TSYNC, 1), (sc.Attr.CTL_OPTIMIZE, 2)):  # 2: binary tree
        try:
            flt.set_attr(attr, value)
        except OSError:
            pass  # an older libseccomp: same rules, slower lookup
    deny = sc.ERRNO(errno.EPERM)
    if first:
        for name in DENIED:
            _rule(flt, deny, name)
        _rule(flt, sc.ERRNO(errno.ENOSYS), "clone3")
        for flag in _CLONE_NEW:
            _rule(flt, deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    if not processes:
        _rule(flt, deny, "fork")
        _rule(flt, deny, "vfork")
        # prctl(PR_SET_PDEATHSIG, 0) would cancel death with the parent (set before this layer).
        _rule(flt, deny, "prctl", sc.Arg(0, sc.EQ, 1))
        if threads:
            _rule(flt, deny, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
        else:
            _rule(flt, deny, "clone")
    # Signals, limits and scheduling: this process only.
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        if pid is None:
            _rule(flt, deny, name)
        else:
            _rule(flt, deny, name, sc.Arg(0, sc.NE, pid))
    if first:
        for name in ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam",
                     "sched_setattr"):
            _rule(flt, deny, name, sc.Arg(0, sc.NE, 0))
        _rule(flt, deny, "setpriority", sc.Arg(0, sc.NE, 0))  # PRIO_PROCESS only ...
        _rule(flt, deny, "setpriority", sc.Arg(1, sc.NE, 0))  # ... and only itself
        for request in (_TIOCSTI, _TIOCLINUX):
            _rule(flt, deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    return flt


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def to_bpf(flt: sc.SyscallFilter) -> bytes:
    """The filter compiled to classic BPF, to load later without libseccomp's compile step."""
    r, w = os.pipe()
    try:
        with os.fdopen(w, "wb", closefd=True) as out:
            flt.export_bpf(out)
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
    finally:
        os.close(r)
    return b"".join(chunks)


def load_bpf(program: bytes) -> None:
    """Install a compiled filter on this process (no_new_privs must already be set)."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.addressof(buf))  # 8 bytes per instruction
    if _libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, MODE_FILTER
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


_libc = ctypes.CDLL(None, use_errno=True)


def available() -> bool:
    """libseccomp loads and the kernel has seccomp filters."""
    return _libc.prctl(21, 0, 0, 0, 0) >= 0  # PR_GET_SECCOMP: EINVAL without CONFIG_SECCOMP
