"""SQLite connections that run generated SQL (env code, LLM-written DDL and INSERTs).

SQLite can open and write other files from plain SQL: ``ATTACH DATABASE '/any/path'`` (then
``CREATE TABLE x.t AS SELECT ...``), ``VACUUM INTO '/any/path'``, ``load_extension()``, and a few
pragmas (``temp_store_directory``). ``harden`` closes those with two independent layers: the
attach limit set to 0 and an authorizer that denies ATTACH/DETACH (VACUUM INTO asks for ATTACH on
its target), extension loading and any pragma not on a short list. The authorizer also denies
every statement from env code whose call already ended (a task or thread that outlived it).
SQLite consults an authorizer only when it prepares a statement; ``Fence`` stops statements that
are already prepared (cached, kept in a cursor) from running for code other than their
connection's own call.
"""

from __future__ import annotations

import sqlite3
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from envfarm.confined import _guard

#: Largest string or blob a statement may build: ``zeroblob(10**9)`` would take a gigabyte.
MAX_LENGTH = 64 << 20

_ALLOWED_PRAGMAS = frozenset({
    "foreign_keys", "foreign_key_list", "foreign_key_check", "defer_foreign_keys", "table_info",
    "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "database_list",
    "collation_list", "function_list", "module_list", "pragma_list", "compile_options",
    "user_version", "application_id", "integrity_check", "quick_check", "case_sensitive_like",
    "recursive_triggers", "busy_timeout", "encoding", "journal_mode", "synchronous", "cache_size",
    "cache_spill", "page_count", "page_size", "max_page_count", "freelist_count",
    "legacy_alter_table", "automatic_index", "optimize", "analysis_limit", "data_version",
    "read_uncommitted", "reverse_unordered_selects", "query_only", "cell_size_check",
    "ignore_check_constraints", "count_changes", "short_column_names", "full_column_names",
    "empty_result_callbacks", "locking_mode", "secure_delete", "auto_vacuum",
    "incremental_vacuum", "shrink_memory", "wal_checkpoint", "wal_autocheckpoint", "threads",
})
#: Readable but not settable: a file-backed temp store or a rewritten schema cookie.
_READ_ONLY_PRAGMAS = frozenset({"temp_store", "schema_version"})
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile",
                               "edit"})


def authorize(action: int, arg1, arg2, db_name, trigger) -> int:
    """The SQLite authorizer of every connection that runs generated SQL."""
    if action == sqlite3.SQLITE_ATTACH or action == sqlite3.SQLITE_DETACH:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA:
        name = (arg1 or "").lower()
        if not (name in _ALLOWED_PRAGMAS or (name in _READ_ONLY_PRAGMAS and arg2 is None)):
            return sqlite3.SQLITE_DENY
    elif action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    guard = _guard.active_guard()
    if guard is not None and guard.done:
        return sqlite3.SQLITE_DENY  # code that outlived its call touches no state
    return sqlite3.SQLITE_OK


class GuardedConnection(sqlite3.Connection):
    """A connection whose guard env code cannot lift through the raw DBAPI object."""

    def _host_only(self, what: str) -> None:
        if _guard.in_env_code():
            raise _guard.SandboxViolation(f"env code may not call Connection.{what}")

    def set_authorizer(self, *args, **kwargs):
        self._host_only("set_authorizer")
        return super().set_authorizer(*args, **kwargs)

    def setlimit(self, *args, **kwargs):
        self._host_only("setlimit")
        return super().setlimit(*args, **kwargs)

    def enable_load_extension(self, *args, **kwargs):
        self._host_only("enable_load_extension")
        return super().enable_load_extension(*args, **kwargs)

    def load_extension(self, *args, **kwargs):
        self._host_only("load_extension")
        return super().load_extension(*args, **kwargs)

    def set_progress_handler(self, *args, **kwargs):
        self._host_only("set_progress_handler")
        return super().set_progress_handler(*args, **kwargs)

    def set_trace_callback(self, *args, **kwargs):
        self._host_only("set_trace_callback")
        return super().set_trace_callback(*args, **kwargs)

    def backup(self, *args, **kwargs):
        self._host_only("backup")
        return super().backup(*args, **kwargs)

    def deserialize(self, *args, **kwargs):
        self._host_only("deserialize")  # a crafted image is SQLite's least-tested input
        super().set_authorizer(None)  # deserialize runs an internal ATTACH of "main"
        try:
            return super().deserialize(*args, **kwargs)
        finally:
            super().set_authorizer(self.envfarm_authorizer)

    #: This connection's authorizer (an instance's also checks that its own lease is calling).
    envfarm_authorizer = staticmethod(authorize)


def harden(conn: sqlite3.Connection, authorizer=authorize) -> sqlite3.Connection:
    """Fence ``conn`` for generated SQL (see the module docstring); returns it."""
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_LENGTH)
    if isinstance(conn, GuardedConnection):
        conn.envfarm_authorizer = authorizer
    conn.set_authorizer(authorizer)
    return conn


class Fence:
    """Stops every statement on one instance's connection, prepared or not, from taking a step
    unless the code running it is that connection's own call (``CallGuard.conn``), or host code
    inside ``host()``.

    It is the connection's SQLite progress handler with a period of one VM instruction, so
    SQLite calls it before any ``sqlite3_step`` returns a row or finishes, and a non-zero
    answer interrupts the statement (its writes rolled back). That is a Python call every few
    VM instructions (a 1,000-row scan: 3,000), so while the only call in flight in the process
    runs a step of its own code the handler is lifted (``lift``) and put back right after
    (``end_lift``): no other env code can run then. This replaces expiring every cached
    statement after each call (each call then re-prepared all its SQL: ~100-200 us), and also
    covers what that did not: a cursor halfway through its rows, and code that runs as host
    code (a loop callback in an empty ``contextvars.Context``).

    Only the thread that lifted a fence puts it back, and only while no other thread can be
    inside SQLite on that connection: ``set_progress_handler`` takes the connection's mutex
    with the GIL held, so called while another thread steps (and needs the GIL for a callback)
    it deadlocks. A call that starts meanwhile waits for the lifted step to end (``_Calls``);
    a call that hands work to a thread puts its fence back first (``_confine``'s anyio patch).
    """

    __slots__ = ("__weakref__", "_conn", "_host")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = weakref.ref(conn)
        self._host = False
        self._handler(self)  # a new connection: no other thread has it yet

    def __call__(self) -> int:
        guard = _guard.active_guard()
        if guard is None:
            return 0 if self._host else 1
        return 0 if guard.conn is self._conn() and not guard.done else 1

    def _handler(self, handler) -> None:
        conn = self._conn()
        if conn is not None:
            try:  # the base method: the override refuses callers inside env code
                sqlite3.Connection.set_progress_handler(conn, handler, 1)
            except sqlite3.ProgrammingError:
                pass  # closed: an instance's failed call or reset replaced it

    def lift(self, guard) -> bool:
        """Lift the fence for one step of ``guard``'s call, if it is the only call in flight
        and none of its work is on another thread; True if lifted (``end_lift`` after)."""
        calls = _calls
        if calls.solo is not self or guard.handoffs or not calls.lift_lock.acquire(False):
            return False
        if calls.solo is not self:  # another call started between the check and the lock
            calls.lift_lock.release()
            return False
        calls.lifted, calls.lifter = self, threading.get_ident()
        calls.lifts += 1
        self._handler(None)
        return True

    def end_lift(self) -> None:
        """Put the fence back if this thread lifted it (a no-op otherwise)."""
        calls = _calls
        if calls.lifted is self and calls.lifter == threading.get_ident():
            try:
                self._handler(self)
            finally:
                calls.lifted = calls.lifter = None
                calls.lift_lock.release()

    @contextmanager
    def host(self) -> Iterator[None]:
        """Host code's own statements on this connection (state keys, rollback)."""
        self._host = True
        try:
            yield
        finally:
            self._host = False


class _Calls:
    """Calls in flight in this process, and which one may run unfenced (``Fence``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self.solo: Fence | None = None
        #: Set once a call timed out: its code may still run somewhere, so no fence is lifted.
        self.stale = False
        #: Held while a fence is lifted, by the thread that lifted it.
        self.lift_lock = threading.Lock()
        self.lifted: Fence | None = None
        self.lifter: int | None = None
        #: False turns lifting off (benchmarks compare the two).
        self.lift_enabled = True
        self.lifts = 0  # steps run unfenced, for tests and benchmarks

    def started(self, fence: Fence) -> None:
        with self._lock:
            self._in_flight += 1
            alone = self._in_flight == 1 and not self.stale and self.lift_enabled
            self.solo = fence if alone else None
        if alone:
            return
        lifted = self.lifted
        if lifted is not None and self.lifter == threading.get_ident():
            lifted.end_lift()
        else:
            # Another call's step may be running unfenced on another thread: wait for it to
            # end (it puts its fence back itself); solo is None now, so it is not lifted again.
            with self.lift_lock:
                pass

    def ended(self, fence: Fence) -> None:
        with self._lock:
            self._in_flight -= 1
            if self.solo is fence:
                self.solo = None


_calls = _Calls()
call_started, call_ended = _calls.started, _calls.ended


def some_call_timed_out() -> None:
    """A call's code may outlive it: never run a connection unfenced in this process again."""
    _calls.stale = True


def connect_memory(check_same_thread: bool = False) -> GuardedConnection:
    """A fresh, hardened in-memory database."""
    conn = sqlite3.connect(":memory:", check_same_thread=check_same_thread,
                           factory=GuardedConnection)
    # Sorts and temporary tables in memory: a jailed worker may create no file. Set before the
    # authorizer, which lets env code read temp_store but not set it.
    conn.execute("PRAGMA temp_store=MEMORY")
    return harden(conn)
