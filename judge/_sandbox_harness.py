"""What runs in a verifier child (see ``_sandbox_worker.py``, the zygote that forks it).

The child tightens the jail (no new processes or threads, its own CPU limit, its own process
group, only its two pipe ends open, a Landlock layer of its own), reads its one request, runs
the verifier once, writes one reply and exits. Nothing survives it: no module, builtin, file,
thread or process. Inside, the Python layers give typed errors for what a verifier should not
do; the kernel jail is the boundary when they are beaten:

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
unmarshalled). Standard library only: the zygote imports it by path, beside itself.
"""
from __future__ import annotations

import builtins
import functools
import gc
import json
import marshal
import os
import struct
import sys
import types


def _lean_lru_cache(maxsize: int | None, typed: bool = False):
    """``functools.lru_cache`` as sqlite3 uses it (a statement cache for each connection it
    opens), minus ``update_wrapper``: the same C cache, without running Python per connection
    (~15 us and a few copied pages in a child; LLM-written verifiers connect once a query)."""
    return lambda function: functools._lru_cache_wrapper(function, maxsize, typed,
                                                         functools._CacheInfo)


def _load_sqlite3() -> types.ModuleType:
    """sqlite3, with its statement caches made by ``_lean_lru_cache`` (it looks
    ``functools.lru_cache`` up once, as it loads)."""
    lru_cache, functools.lru_cache = functools.lru_cache, _lean_lru_cache
    try:
        import sqlite3 as module
    finally:
        functools.lru_cache = lru_cache
    return module


sqlite3 = _load_sqlite3()

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
    # One read, as a rule: the front wrote the whole request before its job started.
    data = os.read(fd, n)
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _recv(fd: int) -> tuple[dict, types.CodeType]:
    """The request (marshalled by the front: its fields, then the verifier's bytecode)."""
    size, code_size = struct.unpack("!II", _read_exact(fd, 8))
    data = memoryview(_read_exact(fd, size + code_size))  # slices of it copy nothing
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


# Made once in the zygote (see _sandbox_worker._confine), used by each child.
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


def _verify_once(prepared, fds: list[int], cpu_s: float, config: dict) -> None:
    """The forked child: tighten the jail, run one verifier, write one reply, exit."""
    req_fd, rep_fd, *ruleset = fds
    # Its own Landlock layer comes with the job, made by the front: of the staged databases,
    # this verification's two only. Stacked before it reads a byte of its request.
    prepared.enter((0, 1, 2, req_fd, rep_fd), cpu_s, ruleset[0] if ruleset else None)
    gc.disable()  # a collection would touch (and so copy) pages shared with the zygote
    # Unmarshalled before the hook, which refuses marshal to the verifier.
    req, compiled = _recv(req_fd)
    os.close(req_fd)
    sys.addaudithook(_HOOK)
    try:
        reply = _run_one(req, compiled, _STATE, _BUILTINS, int(config["max_result_bytes"]))
    except MemoryError:  # e.g. serializing a huge result
        reply = {"ok": False, "kind": "memory", "error": "memory limit exceeded (MemoryError)"}
    except BaseException as exc:  # noqa: BLE001 - report; the process ends here anyway
        reply = {"ok": False, "kind": "crashed", "error": f"worker failure: {_describe(exc)}"}
    _send(rep_fd, reply)
