"""The seccomp filter: a deny list compiled by libseccomp (through ``pyseccomp``), behind a
short hand-written prefix.

Default allow, because CPython and SQLite use a wide and changing set of syscalls; what is denied
is every door out of the process: new sockets, exec, new processes, other processes' memory and
signals, kernel surfaces that bypass seccomp (io_uring) or reach beyond the process (mount,
namespaces, bpf, keyrings, SysV IPC), and, as a second wall behind the uid switch, every change
to a file's metadata (mode, owner, xattrs, timestamps), watching folders (inotify: other
tenants' file names in /tmp), mount listings, file locks on host files (an in-memory SQLite
database takes none), memory-backed files (memfd: memory outside RLIMIT_AS, and an exec source).
Denials answer EPERM (so Python raises a typed ``PermissionError``); clone3 answers ENOSYS so
glibc falls back to clone, whose flags seccomp can read. Syscalls of another ABI (i386, x32)
kill the process: libseccomp's bad-arch action.

The prefix (``_prefix``) does what libseccomp rules cannot say: ``ioctl`` is an allow list of
the terminal and descriptor requests CPython makes (anything else, file flags, socket ioctls such
as SIOCGIFCONF on the event loop's socketpair, is EPERM), and syscall numbers above the highest
one reviewed here (``HIGHEST_REVIEWED``) answer ENOSYS, so a syscall a newer kernel adds is
denied until someone looks at it. Arguments are compared on their low 32 bits wherever the
kernel reads an int (a caller may set the upper half of the register).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

import pyseccomp as sc

# Flags of clone(2) that make new namespaces; never allowed, even where processes are.
_CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
              0x40000000, 0x00000080)  # NS, CGROUP, UTS, IPC, USER, PID, NET, TIME
_CLONE_THREAD = 0x00010000

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
    # file metadata: a second wall behind the uid switch (a farm that is not root keeps the
    # farm user's uid, and owns its files)
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    "setxattrat", "removexattrat", "file_setattr", "utime", "utimes", "utimensat", "futimesat",
    # watching and listing what others do: folders, mounts, page cache
    "inotify_init", "inotify_init1", "inotify_add_watch", "listmount", "statmount",
    "cachestat", "open_tree_attr",
    # locks on host files (in-memory SQLite takes none), memory-backed files, LSM settings
    "flock", "memfd_create", "memfd_secret", "lsm_set_self_attr",
)

#: Syscalls newer than libseccomp 2.5 knows by name; their numbers are the same on every
#: architecture since 424 (the kernel unified the table).
_BY_NUMBER = {"memfd_secret": 447, "cachestat": 451, "fchmodat2": 452, "statmount": 457,
              "listmount": 458, "lsm_set_self_attr": 460, "setxattrat": 463,
              "removexattrat": 466, "open_tree_attr": 467, "file_setattr": 469}
#: The highest syscall number whose meaning was reviewed for this filter (Linux 6.18's last).
HIGHEST_REVIEWED = 469

# fcntl commands: record locks (host files), leases, folder notifications, and SIGIO
# ownership (a signal to any process the caller may signal, delivered later by the kernel).
_F_GETLK, _F_SETLK, _F_SETLKW, _F_SETOWN, _F_SETSIG, _F_SETOWN_EX = 5, 6, 7, 8, 10, 15
_F_OFD_GETLK, _F_OFD_SETLK, _F_OFD_SETLKW, _F_SETLEASE, _F_NOTIFY = 36, 37, 38, 1024, 1026
DENIED_FCNTL = (_F_GETLK, _F_SETLK, _F_SETLKW, _F_SETOWN, _F_SETSIG, _F_SETOWN_EX,
                _F_OFD_GETLK, _F_OFD_SETLK, _F_OFD_SETLKW, _F_SETLEASE, _F_NOTIFY)
#: ioctl requests allowed (all others EPERM): isatty (TCGETS), terminal size, foreground process
#: group, bytes readable, non-blocking and close-on-exec flags (CPython sets these by ioctl).
ALLOWED_IOCTLS = (0x5401, 0x5413, 0x540F, 0x541B, 0x5421, 0x5450, 0x5451)
_LOW32 = 0xFFFFFFFF


def _rule(flt: sc.SyscallFilter, action: int, name: str, *args: sc.Arg) -> None:
    syscall = name
    if sc.resolve_syscall(sc.Arch.NATIVE, name) < 0:
        syscall = _BY_NUMBER.get(name)
        if syscall is None:
            return  # a syscall this architecture does not have
    try:
        flt.add_rule(action, syscall, *args)
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
        _rule(flt, deny, "prctl", sc.Arg(0, sc.MASKED_EQ, _LOW32, 1))
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
        for command in DENIED_FCNTL:
            _rule(flt, deny, "fcntl", sc.Arg(1, sc.MASKED_EQ, _LOW32, command))
    return flt


# Classic BPF, as seccomp runs it: (code, jt, jf, k) per instruction.
_LD_ABS_W, _JEQ_K, _JGT_K, _JGE_K, _RET_K = 0x20, 0x15, 0x25, 0x35, 0x06
_RET_ERRNO = 0x00050000
_NATIVE = {"x86_64": (0xC000003E, 16), "aarch64": (0xC00000B7, 29)}  # AUDIT_ARCH_*, ioctl's nr
_X32_BIT = 0x40000000
_ARG1_LOW = 24  # offsetof(struct seccomp_data, args[1]), its low half on little-endian


def _prefix(highest: int) -> bytes:
    """Instructions run before libseccomp's program (whose jumps are all relative, so it runs
    unchanged after them): ioctl's allow list and ENOSYS above ``highest``. Empty where the
    architecture is not one described here."""
    native = _NATIVE.get(platform.machine())
    if native is None or sys.byteorder != "little":
        return b""
    arch, ioctl_nr = native
    allowed = len(ALLOWED_IOCTLS)
    # The prefix's ENOSYS answer (after its EPERM one), and the first instruction after it.
    nosys_at, rest = 8 + allowed, 9 + allowed
    code: list[tuple[int, int, int, int]] = []

    def jump(op: int, k: int, if_true: int | None, if_false: int | None) -> None:
        pc = len(code) + 1  # jumps count from the next instruction
        code.append((op, 0 if if_true is None else if_true - pc,
                     0 if if_false is None else if_false - pc, k))

    code.append((_LD_ABS_W, 0, 0, 4))                        # 0: arch
    jump(_JEQ_K, arch, None, rest)                           # 1: another ABI: libseccomp's
    code.append((_LD_ABS_W, 0, 0, 0))                        # 2: syscall number
    jump(_JGE_K, _X32_BIT, rest, None)                       # 3: x32: libseccomp's (it kills)
    jump(_JGT_K, highest, nosys_at, None)                    # 4: newer than reviewed: ENOSYS
    jump(_JEQ_K, ioctl_nr, None, rest)                       # 5: not ioctl: libseccomp's
    code.append((_LD_ABS_W, 0, 0, _ARG1_LOW))                # 6: ioctl's request, low half
    for request in ALLOWED_IOCTLS:
        jump(_JEQ_K, request, rest, None)
    code.append((_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))    # an ioctl not in the list
    code.append((_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS))   # nosys_at
    return b"".join(struct.pack("=HBBI", *ins) for ins in code)


def program(pid: int | None, threads: bool, processes: bool, first: bool = True,
            highest: int = HIGHEST_REVIEWED) -> bytes:
    """The filter of ``build`` compiled to classic BPF, behind the prefix on a first layer (a
    later layer stacks on it: the kernel runs both and the stricter answer wins)."""
    compiled = to_bpf(build(pid, threads, processes, first))
    return _prefix(highest) + compiled if first else compiled


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
