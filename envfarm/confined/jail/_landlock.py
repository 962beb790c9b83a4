"""Landlock through its three syscalls (ctypes), for every ABI up to 7.

The ``landlock`` package on PyPI (1.0.0.dev5) handles file-system rights only; TCP rules (ABI 4)
and scopes for signals and abstract unix sockets (ABI 6) need the longer ruleset struct, so this
small layer speaks to the kernel itself.
"""

from __future__ import annotations

import ctypes
import os
import stat

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # same on every arch
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1

# File-system rights (include/uapi/linux/landlock.h), and the ABI that added them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_BY_ABI = {1: (1 << 13) - 1, 2: 1 << 13, 3: 1 << 14, 5: 1 << 15}  # ABI 1: bits 0..12
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # packed in the kernel's header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(*args) -> int:
    ret = _libc.syscall(*args)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def abi_version() -> int:
    """The kernel's Landlock ABI, 0 when Landlock is missing or disabled."""
    try:
        return _syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError:
        return 0


def handled_fs(abi: int) -> int:
    return sum(bits for since, bits in _FS_BY_ABI.items() if abi >= since)


def open_paths(paths: list[str]) -> list[tuple[int, bool]]:
    """O_PATH descriptors of ``paths`` (those that exist), each with whether it is a folder."""
    out = []
    for path in paths:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a path that is gone grants nothing
        try:
            out.append((fd, stat.S_ISDIR(os.fstat(fd).st_mode)))
        except OSError:
            os.close(fd)
    return out


def _ruleset_attr(abi: int) -> tuple[_RulesetAttr, int]:
    attr = _RulesetAttr(handled_access_fs=handled_fs(abi))
    size = 8
    if abi >= 4:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL
        size = 24
    return attr, size


def read_only_ruleset(paths: list[str], abi: int,
                      opened: tuple[tuple[int, bool], ...] = ()) -> int:
    """A ruleset fd: reads under ``paths`` and the already ``opened`` ones only, no writes
    anywhere, no TCP bind/connect, no signals or abstract unix sockets beyond the domain. It can
    be made once and applied, with ``restrict_self``, in every child forked after (the fd is
    inherited)."""
    return ReadRules(abi, opened).ruleset(paths)


class ReadRules:
    """``read_only_ruleset`` for many calls over the same ``opened`` roots (a verifier
    sandbox's front makes one per verification): the attributes and the roots' rules are made
    once, each call adds its own ``paths``."""

    def __init__(self, abi: int, opened: tuple[tuple[int, bool], ...] = ()) -> None:
        attr, size = _ruleset_attr(abi)
        self._create = (ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr),
                        ctypes.c_size_t(size), ctypes.c_uint32(0))
        self._rules = [ctypes.byref(_rule(fd, is_dir)) for fd, is_dir in opened]
        self._keep = attr  # what the byref()s above point into

    def ruleset(self, paths: list[str]) -> int:
        ruleset = _syscall(*self._create)
        try:
            for rule in self._rules:
                _add_rule(ruleset, rule)
            for fd, is_dir in open_paths(paths):
                try:
                    _add_rule(ruleset, ctypes.byref(_rule(fd, is_dir)))
                finally:
                    os.close(fd)
        except BaseException:
            os.close(ruleset)
            raise
        return ruleset


def _rule(fd: int, is_dir: bool) -> _PathBeneathAttr:
    return _PathBeneathAttr(allowed_access=READ_FILE | (READ_DIR if is_dir else 0), parent_fd=fd)


_ADD_RULE, _PATH_BENEATH = ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(_RULE_PATH_BENEATH)


def _add_rule(ruleset: int, rule) -> None:
    _syscall(_ADD_RULE, ctypes.c_int(ruleset), _PATH_BENEATH, rule, ctypes.c_uint32(0))


_RESTRICT_SELF, _NO_FLAGS = ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_uint32(0)


def restrict_self(ruleset: int) -> None:
    """Apply a ruleset to this thread (and what it forks later). Needs no_new_privs already set
    and a single-threaded process. (Its constant arguments are made once: in a zygote's child,
    each object made is a page copied.)"""
    _syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), _NO_FLAGS)


def restrict_read_only(paths: list[str], abi: int,
                       opened: tuple[tuple[int, bool], ...] = ()) -> None:
    """``read_only_ruleset`` applied to this process at once."""
    ruleset = read_only_ruleset(paths, abi, opened)
    try:
        restrict_self(ruleset)
    finally:
        os.close(ruleset)
