"""The verifier zygote and its children: every verification runs in a fresh, confined process.

Started by ``judge.sandbox.VerifierSandbox`` as ``python -I -S -B _sandbox_worker.py CONFIG``
with one end of a SOCK_SEQPACKET socket pair as its control channel. It loads the standard-library
modules verifiers may use and ``envfarm.confined.jail`` (nothing else of the project; the front compiled
its seccomp filters), and enters the kernel jail (it may fork, nothing else), switching to an
unprivileged uid of its own when started as root. Per verification the front sends two pipe
ends (SCM_RIGHTS): the request to read, the reply to write. The zygote forks a child, tells the
front its pid (killed at the deadline) and, later, how it ended; it never reads a request.

The child tightens the jail (no new processes or threads, its own CPU limit, its own process
group, only its two pipe ends open), reads its one request, runs the verifier once, writes one
reply and exits. Nothing survives it: no module, builtin, file, thread or process. Inside, the
Python layers give typed errors for what a verifier should not do; the kernel jail is the
boundary when they are beaten:

1. A PEP 578 audit hook, impossible to remove from Python: it refuses sockets, subprocesses, os.*
   calls, writes, reads outside the Python installation, new imports outside the allowlist,
   ctypes, gc/frame introspection, and SQLite connections to anything but the two read-only
   copies.
2. The verifier's builtins: no open/exec/eval/compile/input, an ``__import__`` that only hands
   out allowlisted modules, and a ``sqlite3`` whose ``connect`` opens the copies read-only and
   immutable.
3. Every SQLite connection, ``:memory:`` ones included, however made (the hook sees each new
   handle): attach limit 0 and an authorizer that denies ATTACH/DETACH (and so ``VACUUM INTO``
   and reading other database files), extension loading and unlisted pragmas; its class refuses
   the methods that would lift those (``set_authorizer``, ``setlimit``, ...).

Wire format on the pipes: the request, from the front, is two 4-byte big-endian lengths, then
its fields and the verifier's bytecode, each marshalled (the front compiled the code: compiling
runs nothing); the reply is a 4-byte length, then a UTF-8 JSON object (nothing from a child is
unmarshalled). On the control socket, one message per datagram: the zygote's JSON hello, then
``JOB`` and ``NOTE`` structs.
"""

from __future__ import annotations

import base64
import builtins
import gc
import json
import marshal
import os
import signal
import socket
import sqlite3
import struct
import sys
import time
import types

#: Modules verifier code may import (top-level names).
ALLOWED_IMPORTS = frozenset({
    "sqlite3", "json", "re", "datetime", "math", "collections", "itertools", "functools",
    "statistics", "decimal", "fractions", "typing", "dataclasses", "enum", "string", "time",
    "calendar", "copy", "operator", "heapq", "bisect", "hashlib", "difflib", "textwrap",
    "unicodedata", "numbers", "random", "__future__", "abc", "contextlib", "pprint",
})
# Loaded lazily by allowed modules (strptime, codecs); preloaded too, allowed as a backstop.
_LAZY_OK = frozenset({"_strptime", "encodings", "locale"})

_DENIED_PREFIXES = (
    "os.", "socket.", "subprocess.", "shutil.", "ctypes.", "_ctypes", "gc.", "sys._getframe",
    "sys._current_frames", "sys.setprofile", "sys.settrace", "sys.addaudithook", "sys.remote_exec",
    "code.__new__", "function.__new__", "marshal.", "pickle.", "object.__getattr__",
    "object.__setattr__", "object.__delattr__", "sqlite3.enable_load_extension",
    "sqlite3.load_extension", "resource.", "_thread.start_new_thread", "fcntl.",
    "mmap.", "syslog.", "webbrowser.", "urllib.", "http.", "ftplib.", "smtplib.", "imaplib.",
    "poplib.", "nntplib.", "telnetlib.", "builtins.input", "pty.", "tempfile.", "glob.",
    "posixsubprocess", "signal.", "winreg.", "msvcrt.", "_winapi.", "ensurepip.",
    "cpython.remove_audit_hook",
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

#: Control datagrams after the zygote's JSON hello: a job (its id and CPU limit, with the
#: request pipe's read end and the reply pipe's write end), and notes on a job's child.
JOB = struct.Struct("!Id")
NOTE = struct.Struct("!BIq")  # STARTED with the child's pid, ENDED with its wait status
STARTED, ENDED = 1, 2

#: Pragmas a verifier may use (reading the schema, mostly); every other one is denied.
_ALLOWED_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "foreign_key_check", "foreign_keys", "integrity_check", "quick_check",
    "user_version", "application_id", "page_count", "page_size", "freelist_count", "encoding",
    "collation_list", "function_list", "pragma_list", "compile_options", "data_version",
    "case_sensitive_like", "query_only", "cache_size", "database_list",
})
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile",
                               "edit"})


class ForbiddenOperation(BaseException):
    """Raised by the audit hook; a BaseException so ``except Exception`` does not hide it."""


def _read_exact(fd: int, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _recv(fd: int) -> tuple[dict, types.CodeType]:
    """The request (marshalled by the front: its fields, then the verifier's bytecode)."""
    size, code_size = struct.unpack("!II", _read_exact(fd, 8))
    data = _read_exact(fd, size + code_size)
    return marshal.loads(data[:size]), marshal.loads(data[size:])


def _send(fd: int, msg: dict) -> None:
    data = json.dumps(msg).encode()
    data = len(data).to_bytes(4, "big") + data
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _CallState:
    """What the hook and the sqlite3 shim need to know about the call in progress."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.db_uris: dict[str, str] = {}  # staged path -> read-only immutable URI
        # A connection per staged database, held while the verifier runs, whose cache its
        # connections share: the schema is parsed once, not once per connection each query.
        self.keepers: dict[str, object] = {}
        self.opening = False  # inside _LockedConnection.__init__
        self.reseeded = False  # random, seeded in the zygote, reseeded once for this child

    def violate(self, what: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(what)
        raise ForbiddenOperation(what)


def _make_hook(state: _CallState, read_roots: tuple[str, ...]):
    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writing:
                state.violate(f"writing a file ({path!r})")
            if isinstance(path, (str, bytes)):
                p = os.fsdecode(path)
                if not p.startswith(read_roots):
                    state.violate(f"reading a file outside the sandbox ({p!r})")
            return
        if event == "import":
            top = str(args[0]).split(".")[0]
            if top not in ALLOWED_IMPORTS and top not in _LAZY_OK:
                state.violate(f"forbidden import {args[0]}")
            return
        if event == "sqlite3.connect":
            db = os.fspath(args[0]) if args[0] is not None else ""
            if db not in (":memory:", "") and db not in state.db_uris.values():
                state.violate(f"sqlite3.connect to {db!r}")
            return
        if event == "sqlite3.connect/handle":
            # Only _LockedConnection.__init__ may open a database: it hardens what it opened.
            if type(args[0]) is not _LockedConnection or not state.opening:
                state.violate(f"a sqlite3 connection made around the sandbox's connect "
                              f"({type(args[0]).__name__})")
            return
        if event.startswith(_DENIED_PREFIXES):
            if event.startswith("object.__") and len(args) >= 2:
                state.violate(f"{event} ({type(args[0]).__name__}.{args[1]})")
            state.violate(event)

    return hook


def _private_copies(state: _CallState) -> dict[int, types.ModuleType]:
    """A copy of each allowed module, made once in the zygote: each child gets a pristine
    one, and an import copies nothing (a copy touched every page its names live on)."""
    copies = {id(sys.modules[name]): _private_copy(sys.modules[name])
              for name in sorted(ALLOWED_IMPORTS - {"sqlite3"})}
    copies[id(sqlite3)] = _sqlite_shim(state)  # also what any sqlite3.* import gives
    return copies


def _private_copy(module: types.ModuleType) -> types.ModuleType:
    # `json.dumps = None` in a verifier must not break the harness, which uses json after it.
    clone = types.ModuleType(module.__name__)
    clone.__dict__.update(module.__dict__)
    return clone


def _safe_builtins(state: _CallState, copies: dict[int, types.ModuleType]) -> dict:
    safe = dict(builtins.__dict__)
    for name in ("open", "exec", "eval", "compile", "input", "breakpoint", "help", "exit",
                 "quit", "copyright", "credits", "license", "__loader__", "__spec__"):
        safe.pop(name, None)
    real_import = builtins.__import__
    sqlite_id, random = id(sys.modules["sqlite3"]), sys.modules["random"]

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        top = name.split(".")[0]
        if level != 0 or top not in ALLOWED_IMPORTS:
            state.violations.append(f"forbidden import {name}")
            raise ImportError(f"forbidden import {name}")
        module = real_import(name, globals, locals, fromlist, level)
        if top in ("random", "statistics") and not state.reseeded:
            state.reseeded = True
            random.seed()  # the zygote's seed, till now (see _preload)
        copy = copies.get(sqlite_id if top == "sqlite3" else id(module))
        if copy is None:  # a submodule (`from collections import abc`): copied now
            copy = copies[id(module)] = _private_copy(module)
        return copy

    def quiet_print(*args, **kwargs):  # verifier output would corrupt nothing, but is noise
        return None

    safe["__import__"] = guarded_import
    safe["print"] = quiet_print
    return safe


def _authorize(action: int, arg1, arg2, db_name, trigger) -> int:
    if action == sqlite3.SQLITE_ATTACH or action == sqlite3.SQLITE_DETACH:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() not in _ALLOWED_PRAGMAS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _harden(conn) -> None:
    sqlite3.Connection.setlimit(conn, sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    sqlite3.Connection.setlimit(conn, sqlite3.SQLITE_LIMIT_LENGTH, 64 << 20)
    # Sorts and temporary tables in memory: the jail lets the process create no file.
    sqlite3.Connection.execute(conn, "PRAGMA temp_store=MEMORY")
    sqlite3.Connection.set_authorizer(conn, _authorize)


def _locked_connection_class(state: _CallState) -> type:
    """The only sqlite3 connection class verifier code gets: it cannot lift ``_harden``."""
    def refuse(name):
        def method(self, *args, **kwargs):
            state.violate(f"sqlite3 Connection.{name}")
        method.__name__ = name
        return method

    def __init__(self, *args, **kwargs):
        state.opening = True
        try:
            sqlite3.Connection.__init__(self, *args, **kwargs)
        finally:
            state.opening = False
        _harden(self)

    names = ("set_authorizer", "setlimit", "enable_load_extension", "load_extension",
             "set_progress_handler", "set_trace_callback", "deserialize")
    return type("Connection", (sqlite3.Connection,),
                {"__init__": __init__, **{n: refuse(n) for n in names}})


# Made once in the zygote (see _confine), used by each child.
_LockedConnection: type | None = None
_STATE: _CallState | None = None
_BUILTINS: dict | None = None
_HOOK = None


def _sqlite_shim(state: _CallState) -> types.ModuleType:
    shim = types.ModuleType("sqlite3")
    shim.__dict__.update(sqlite3.__dict__)
    shim.dbapi2 = shim

    def connect(database, *args, **kwargs):
        target = os.fspath(database)
        if isinstance(target, bytes):
            target = os.fsdecode(target)
        if target.startswith("file:"):
            target = target[5:].split("?", 1)[0]
            while target.startswith("//"):
                target = target[1:]
        kwargs["factory"] = _LockedConnection  # hardened by the hook as it is made
        if target in (":memory:", ""):
            return sqlite3.connect(target, *args, **kwargs)
        uri = state.db_uris.get(os.path.normpath(target))
        if uri is None:
            state.violate(f"sqlite3.connect to {database!r}")
        kwargs["uri"] = True
        if uri not in state.keepers:
            state.keepers[uri] = sqlite3.connect(uri, factory=_LockedConnection, uri=True)
        return sqlite3.connect(uri, *args, **kwargs)

    shim.connect = connect
    shim.Connection = _LockedConnection
    return shim


def _describe(exc: BaseException) -> str:
    msg = str(exc)
    if len(msg) > 500:
        msg = msg[:500] + "…"
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _run_one(req: dict, compiled: types.CodeType, state: _CallState, builtins_: dict,
             max_result: int) -> dict:
    state.db_uris = {
        os.path.normpath(path): f"{uri}&cache=shared" for path, uri in (
            (req["initial"], req["initial_uri"]), (req["final"], req["final_uri"]))
    }
    glb = {"__builtins__": builtins_, "__name__": "verifier"}
    try:
        exec(compiled, glb)  # noqa: S102 - running it, fenced, is this process's only job
        fn = glb.get(req["func"])
        if not callable(fn):
            return {"ok": False, "kind": "no_function",
                    "error": f"verifier code defines no function {req['func']!r}"}
        # fn.__code__ is off limits under the audit hook; the front read the signature.
        if req["mode"] == "code" and req.get("takes_answer", True):
            result = fn(req["initial"], req["final"], req.get("final_answer"))
        else:
            result = fn(req["initial"], req["final"])
    except ForbiddenOperation as exc:
        return {"ok": False, "kind": "forbidden", "error": f"forbidden: {exc}"}
    except MemoryError:
        return {"ok": False, "kind": "memory", "error": "memory limit exceeded (MemoryError)"}
    except BaseException as exc:  # noqa: BLE001 - any failure of the verifier is its verdict
        if state.violations:
            return {"ok": False, "kind": "forbidden", "error": f"forbidden: {state.violations[0]}"}
        return {"ok": False, "kind": "raised", "error": f"raised {_describe(exc)}"}
    if state.violations:
        # The verifier swallowed the refusal; it still tried.
        return {"ok": False, "kind": "forbidden", "error": f"forbidden: {state.violations[0]}"}
    if not isinstance(result, dict):
        return {"ok": False, "kind": "bad_return",
                "error": f"non-JSON return: expected a dict, got {type(result).__name__}"}
    try:
        text = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return {"ok": False, "kind": "bad_return", "error": f"non-JSON return: {_describe(exc)}"}
    if len(text) > max_result:
        return {"ok": False, "kind": "bad_return",
                "error": f"non-JSON return: result too large ({len(text)} bytes)"}
    if req["mode"] == "code" and "result" not in result:
        return {"ok": False, "kind": "bad_return",
                "error": "non-JSON return: code-mode verifier returned no 'result' key"}
    return {"ok": True, "result_json": text}


def _verify_once(jail, prepared, req_fd: int, rep_fd: int, cpu_s: float, config: dict) -> None:
    """The forked child: tighten the jail, run one verifier, write one reply, exit."""
    roots = config["opened"]
    prepared.enter(keep_fds=(0, 1, 2, req_fd, rep_fd, *(fd for fd, _ in roots.fds)),
                   cpu_s=cpu_s)
    gc.disable()  # a collection would touch (and so copy) pages shared with the zygote
    # Unmarshalled before the hook, which refuses marshal to the verifier.
    req, compiled = _recv(req_fd)
    os.close(req_fd)
    # Its own Landlock layer: of the staged databases, this verification's two only.
    jail.restrict_reads([req["initial"], req["final"]], roots)
    roots.close()
    sys.addaudithook(_HOOK)
    try:
        reply = _run_one(req, compiled, _STATE, _BUILTINS, int(config["max_result_bytes"]))
    except MemoryError:  # e.g. serializing a huge result
        reply = {"ok": False, "kind": "memory", "error": "memory limit exceeded (MemoryError)"}
    except BaseException as exc:  # noqa: BLE001 - report; the process ends here anyway
        reply = {"ok": False, "kind": "crashed", "error": f"worker failure: {_describe(exc)}"}
    _send(rep_fd, reply)


def _preload() -> None:
    """Import what verifiers may use, once, here: a child importing it would pay each time."""
    # random reseeds itself in every child after a fork (~0.1 ms, ~40 page faults each): not
    # here; a child reseeds it only when its verifier imports it (see _safe_builtins).
    register, os.register_at_fork = os.register_at_fork, lambda **_: None
    try:
        for name in sorted(ALLOWED_IMPORTS | _LAZY_OK):
            __import__(name)
    finally:
        os.register_at_fork = register
    time.strptime("2024-01-01", "%Y-%m-%d")  # warms _strptime's lazy state
    "x".encode("latin-1").decode("ascii")


def _warm_up() -> None:
    """Once here, what each child would do first: SQLite's global set-up (VFSes, ~200 built-in
    functions) at a process's first connection, the hardened connection's first-use state.
    Trusted code on a database of its own; the call state is reset after."""
    conn = sqlite3.connect(":memory:", factory=_LockedConnection, uri=False)
    conn.execute("CREATE TABLE t (x INTEGER, y TEXT)")
    conn.execute("SELECT x, upper(y) FROM t WHERE x = ? ORDER BY y", (1,)).fetchall()
    conn.close()
    json.loads(json.dumps({"result": "complete", "n": [1, 2.5, None, True]}))
    _STATE.__init__()


def _confine(jail, config: dict, ctl: socket.socket):
    """Enter the zygote's jail and make its children's; None (reported) if it cannot."""
    filters = {k: base64.b64decode(v) for k, v in (config.get("seccomp") or {}).items()}
    try:
        # Everything is loaded: started as root, it switches to a uid of its own in there, and
        # from then on nothing can read (or change) what only root may.
        fields = config["policies"]["zygote"]
        zygote = jail.JailPolicy(**{**fields, "read_paths": tuple(fields["read_paths"])},
                                 uid=jail.uid_from_config(config))
        have = jail.enter(zygote, keep_fds=(0, 1, 2, ctl.fileno()),
                          compiled=filters.get("zygote"))
    except jail.JailError as exc:
        ctl.send(json.dumps({"ready": False, "error": str(exc)}).encode())
        return None
    roots = jail.readable_roots()  # without the staging folder
    config["read_roots"] = tuple(os.path.join(p, "") for p in roots)
    config["opened"] = jail.open_roots(roots)
    # Made once here for every child (which starts from a pristine copy: no verifier runs
    # here): the layer it enters (its Landlock layer comes with its databases' names), the
    # call state, builtins and sqlite3 connection class a verifier gets.
    prepared = jail.prepare(jail.JailPolicy(**config["policies"]["child"]),
                            compiled=filters.get("child"), landlock=False)
    global _STATE, _BUILTINS, _LockedConnection, _HOOK
    _STATE = _CallState()
    _LockedConnection = _locked_connection_class(_STATE)
    _BUILTINS = _safe_builtins(_STATE, _private_copies(_STATE))
    _HOOK = _make_hook(_STATE, config["read_roots"])
    _warm_up()
    return have, prepared


def _zygote(config: dict) -> None:
    sys.path[:0] = config["sys_path"]  # only so envfarm.confined.jail loads
    from envfarm.confined import jail

    ctl = socket.socket(fileno=config["ctl_fd"])  # wraps the inherited fd: no socket() call
    _preload()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    confined = _confine(jail, config, ctl)
    if confined is None:
        return
    have, prepared = confined
    gc.freeze()  # what is loaded now stays out of every collection, in here and in children
    gc.disable()  # and none runs here: it would write to (and so copy) pages children share
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # set by _serve; none may end before
    ctl.send(json.dumps({"ready": True, "pid": os.getpid(), "jail": have.describe()}).encode())
    _serve(ctl, lambda fds, cpu_s: _verify_once(jail, prepared, *fds, cpu_s, config))


def _serve(ctl: socket.socket, verify) -> None:
    """Fork a child per job; say when each started and, when reaped, how it ended. Little
    Python per job: whatever this process touches after a fork, it copies (children share
    every page until then)."""
    jobs: dict[int, int] = {}  # child pid -> job id
    ended: dict[int, int] = {}  # reaped before its job was recorded: pid -> status

    def reap(*_) -> None:  # SIGCHLD: runs between two bytecodes of the loop below
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = jobs.pop(pid, None)
            if job is None:
                ended[pid] = status
            else:
                ctl.send(NOTE.pack(ENDED, job, status))

    signal.signal(signal.SIGCHLD, reap)
    ancillary = socket.CMSG_LEN(8)  # two fds
    while True:
        msg, anc, _, _ = ctl.recvmsg(JOB.size, ancillary)
        if not msg:
            return  # the front is gone; the children die with us
        fds = [fd for level, kind, data in anc if level == socket.SOL_SOCKET
               and kind == socket.SCM_RIGHTS for fd in struct.unpack(f"{len(data) // 4}i", data)]
        if len(msg) != JOB.size or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        job, cpu_s = JOB.unpack(msg)
        pid = os.fork()
        if pid == 0:
            try:
                verify(fds, cpu_s)
            finally:
                os._exit(0)
        jobs[pid] = job
        status = ended.pop(pid, None)  # it ended, and was reaped, before the line above
        os.close(fds[0])
        os.close(fds[1])
        ctl.send(NOTE.pack(STARTED, job, pid))
        if status is not None and jobs.pop(pid, None) is not None:
            ctl.send(NOTE.pack(ENDED, job, status))


if __name__ == "__main__":
    _zygote(json.loads(sys.argv[1]))
