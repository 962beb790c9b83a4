"""Env code that attacks the kernel jail with raw system calls (issue 34).

The in-process guard is one line to switch off (``_unguard``: its context variable is reachable
through ``sys.modules``), so each tool switches it off first and then talks to the kernel
through ``ctypes``: whatever stops it is the jail. Every tool *reports* what the kernel answered
(return value, errno) instead of failing, so a test asserts the outcome from the host's side.
"""

from tests.envfarm.worker.hostile_env import with_code

RAW = '''
import importlib as _importlib
import json as _json
import sys as _sys
import threading as _threading


def _unguard():
    guard = _sys.modules["envfarm._guard"]
    guard._current.set(None)
    guard._env_threads.pop(_threading.get_ident(), None)


def _libc():
    _unguard()
    ctypes = _importlib.import_module("ctypes")  # a plain import is refused by name
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def _loop_socket():
    import asyncio
    return asyncio.get_running_loop()._ssock.fileno()


def _arg(ctypes, spec, keep):
    """JSON to a syscall argument: int, str (a C string), {"buf": n} (n zero bytes, returned
    after the call), {"bytes": hex}, {"open": path} (a read-only descriptor, left open),
    {"loop_socket": 1} (the event loop's self-pipe socket)."""
    if isinstance(spec, int):
        return ctypes.c_long(spec)
    if isinstance(spec, str):
        return ctypes.c_char_p(spec.encode())
    if "buf" in spec or "bytes" in spec:
        raw = bytes.fromhex(spec["bytes"]) if "bytes" in spec else bytes(spec["buf"])
        buf = ctypes.create_string_buffer(raw, len(raw))
        keep.append(buf)
        return buf
    if "open" in spec:
        import os
        return ctypes.c_long(os.open(spec["open"], os.O_RDONLY))
    return ctypes.c_long(_loop_socket())


@app.get("/r/syscall", operation_id="raw_syscall")
async def raw_syscall(nr: int, args: str = "[]"):
    ctypes, libc = _libc()
    keep = []
    try:
        argv = [_arg(ctypes, a, keep) for a in _json.loads(args)]
    except OSError as exc:
        return {"rc": -1, "errno": exc.errno, "stage": "setup"}
    rc = libc.syscall(ctypes.c_long(nr), *argv)
    return {"rc": rc, "errno": ctypes.get_errno() if rc < 0 else 0,
            "bufs": [b.raw[:4096].hex() for b in keep]}


@app.get("/r/ifconf", operation_id="list_interfaces")
async def list_interfaces():
    """SIOCGIFCONF through the one socket a worker has: its event loop's socketpair."""
    ctypes, libc = _libc()
    buf = ctypes.create_string_buffer(40 * 64)

    class IfConf(ctypes.Structure):
        _fields_ = [("len", ctypes.c_int), ("buf", ctypes.c_void_p)]

    conf = IfConf(len(buf), ctypes.addressof(buf))
    rc = libc.ioctl(_loop_socket(), 0x8912, ctypes.byref(conf))
    names = [buf.raw[i:i + 16].split(b"\\0")[0].decode() for i in range(0, conf.len, 40)
             ] if rc == 0 else []
    return {"rc": rc, "errno": ctypes.get_errno() if rc < 0 else 0, "names": names}


@app.get("/r/inotify", operation_id="watch_folder")
async def watch_folder(path: str):
    ctypes, libc = _libc()
    fd = libc.inotify_init1(0)
    if fd < 0:
        return {"rc": fd, "errno": ctypes.get_errno(), "stage": "init"}
    rc = libc.inotify_add_watch(fd, path.encode(), 0x100)  # IN_CREATE
    return {"rc": rc, "errno": ctypes.get_errno() if rc < 0 else 0, "stage": "watch"}


@app.get("/r/memfd_exec", operation_id="memfd_exec")
async def memfd_exec():
    ctypes, libc = _libc()
    fd = libc.syscall(319, b"x", 0)  # memfd_create
    out = {"memfd": fd, "memfd_errno": ctypes.get_errno() if fd < 0 else 0}
    argv = (ctypes.c_char_p * 2)(b"x", None)
    rc = libc.syscall(322, max(fd, 0), b"", argv, None, 0x1000)  # execveat(AT_EMPTY_PATH)
    out.update(exec=rc, exec_errno=ctypes.get_errno() if rc < 0 else 0)
    return out


@app.get("/r/threads", operation_id="thread_bomb")
async def thread_bomb(count: int, lift: bool = False):
    """Start ``count`` threads that wait (after trying to lift the kernel's cap if ``lift``);
    reports how many started and what stopped the rest."""
    ctypes, libc = _libc()
    import resource
    out = {}
    if lift:
        for what, fn in (("setrlimit", lambda: resource.setrlimit(
                resource.RLIMIT_NPROC, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))),
                ("setuid0", lambda: __import__("os").setuid(0))):
            try:
                fn()
                out[what] = "done"
            except (OSError, ValueError) as exc:
                out[what] = type(exc).__name__
    out["limit"] = list(resource.getrlimit(resource.RLIMIT_NPROC))
    release = _threading.Event()
    _threading.stack_size(64 << 10)
    started, stopped_by = 0, None
    try:
        for _ in range(count):
            _threading.Thread(target=release.wait, args=(10,), daemon=True).start()
            started += 1
    except Exception as exc:  # noqa: BLE001 - what stopped it is the answer
        stopped_by = f"{type(exc).__name__}: {exc}"
    finally:
        release.set()
        _threading.stack_size(0)
    out.update(started=started, stopped_by=stopped_by)
    return out


@app.get("/r/write_through_fds", operation_id="write_through_fds")
async def write_through_fds(name: str):
    """Create ``name`` under every descriptor the worker holds (its import folders' O_PATH
    descriptors among them), with openat."""
    ctypes, libc = _libc()
    made = {}
    for fd in range(64):
        rc = libc.syscall(257, fd, name.encode(), 0o101, 0o644)  # O_WRONLY|O_CREAT
        if rc >= 0:
            made[fd] = rc
    return {"made": made}


@app.get("/r/identity", operation_id="identity")
async def identity():
    _unguard()
    import os
    return {"uid": os.getresuid(), "gid": os.getresgid(), "groups": os.getgroups(),
            "pid": os.getpid()}


@app.get("/r/lazy", operation_id="lazy_import")
async def lazy_import(name: str):
    """An import the worker did not make before the jail (as generated code does)."""
    import importlib
    module = importlib.import_module(name)
    return {"file": str(getattr(module, "__file__", None))}
'''


def raw_code() -> str:
    return with_code(RAW)
