"""Load generated env code once and bind its ``engine``/``SessionLocal`` per call.

Generated code creates one engine at import time (``create_engine(database_url, ...)``). Rather
than patching its text, we hand it, through an import shim, a single routing engine whose pool
returns the *calling instance's* SQLite connection, looked up in a context variable. One loaded
module then serves any number of isolated instances.
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import functools
import inspect
import sqlite3
import sys
import time
import types
import warnings
import weakref
from typing import Any

import sqlalchemy
from sqlalchemy.pool import Pool
from sqlalchemy.pool.base import _ConnectionRecord

from envfarm.confined import _confine, _guard, _sqlite_guard
from envfarm.errors import EnvLoadError


class Slot:
    """One instance's SQLite connection as the routing engine sees it."""

    __slots__ = ("conn", "record")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.record: _ConnectionRecord | None = None


_slot: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("envfarm_slot", default=None)


def bind(slot: Slot) -> contextvars.Token:
    return _slot.set(slot)


def unbind(token: contextvars.Token) -> None:
    _slot.reset(token)


def _current_slot() -> Slot:
    slot = _slot.get()
    if slot is None:
        raise RuntimeError("env code used the database outside of a tool call")
    guard = _guard.active_guard()
    if guard is not None and guard.done:
        raise RuntimeError("env code used the database after its tool call ended")
    return slot


def _current_connection() -> sqlite3.Connection:
    return _current_slot().conn


class RoutedConnection:
    """The DBAPI connection SQLAlchemy holds. Every use goes to the *calling* instance's
    connection, so a session or connection that env code keeps at module level (``db =
    SessionLocal()``) cannot pin one lease's database for the next lease."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(_current_connection(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(_current_connection(), name, value)


def owned_by_caller(conn: sqlite3.Connection):
    """An authorizer for an instance's connection: what ``_sqlite_guard.authorize`` allows,
    and only while that instance's own call runs (a raw handle kept from another lease's call
    gets 'not authorized' for a new statement; ``_sqlite_guard.Fence`` stops the ones it had
    already prepared)."""
    ref = weakref.ref(conn)

    def authorize(action: int, arg1, arg2, db_name, trigger) -> int:
        verdict = _sqlite_guard.authorize(action, arg1, arg2, db_name, trigger)
        if verdict == sqlite3.SQLITE_OK:
            slot = _slot.get()
            if slot is not None and slot.conn is not ref():
                return sqlite3.SQLITE_DENY
            guard = _guard.active_guard()  # also by thread: code in an empty Context
            if guard is not None and guard.conn is not None and guard.conn is not ref():
                return sqlite3.SQLITE_DENY
        return verdict

    return authorize


class BindingPool(Pool):
    """A pool that hands out the current instance's connection; it never resets or closes it."""

    def _do_get(self) -> _ConnectionRecord:
        slot = _current_slot()
        if slot.record is None:  # one record per instance: connect events run for its conn
            slot.record = _ConnectionRecord(self)
        return slot.record

    def _do_return_conn(self, record: Any) -> None:
        pass  # the instance owns the connection; rollback happens per call in the runtime

    def status(self) -> str:
        return "BindingPool"

    def dispose(self) -> None:
        pass

    def recreate(self) -> BindingPool:
        return self


def routing_engine() -> sqlalchemy.Engine:
    return sqlalchemy.create_engine(
        "sqlite://", creator=RoutedConnection, poolclass=BindingPool,
        pool_reset_on_return=None,
    )


class _ModuleShim(types.ModuleType):
    """A module as generated code sees it: the real one, with a few attributes replaced."""

    def __init__(self, real: types.ModuleType, **overrides: Any) -> None:
        super().__init__(real.__name__)
        self.__real = real
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__real, name)


#: Modules env code may not import by name: the project's own (the guard, secrets, the farm) and
#: the ones that reach around the guard. Not a wall (``sys.modules`` is one lookup away), but
#: it turns the obvious attempt into a clear error.
_DENIED_IMPORTS = frozenset({"envfarm", "judge", "synth", "trainer", "ray", "ctypes", "_ctypes",
                             "gc", "_thread", "faulthandler", "_posixsubprocess"})


def _shim_import(engine: sqlalchemy.Engine):
    real_import = builtins.__import__
    make_engine = lambda *args, **kwargs: engine  # noqa: E731 - same engine, whatever the URL
    shims = {
        "sqlalchemy": _ModuleShim(sys.modules["sqlalchemy"], create_engine=make_engine),
        "sqlalchemy.engine": _ModuleShim(sys.modules["sqlalchemy.engine"],
                                         create_engine=make_engine),
        # Python 3.11 has no audit event for time.sleep, so the guard lives here.
        "time": _ModuleShim(time, sleep=_guard.guarded_sleep),
    }

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.partition(".")[0] in _DENIED_IMPORTS:
            raise ImportError(f"env code may not import {name!r}")
        mod = real_import(name, globals, locals, fromlist, level)
        if level == 0 and (name in shims or name.startswith("sqlalchemy.")):
            if not fromlist:
                return shims[name.partition(".")[0]]
            return shims.get(mod.__name__, mod)
        return mod

    return _import


def load_module(env_name: str, code: str, conn: sqlite3.Connection) -> types.ModuleType:
    """Execute ``code`` once as a fresh module; module-level DB work goes to ``conn``.

    Raises EnvLoadError with the env code's own error when it cannot be imported.
    """
    import sqlalchemy.engine  # noqa: F401  (make sure the shimmed submodule is loaded)

    engine = routing_engine()
    module = types.ModuleType(f"_envfarm_env_{env_name}")
    module.__dict__["__builtins__"] = dict(builtins.__dict__, __import__=_shim_import(engine))
    # Pydantic/FastAPI resolve forward references through sys.modules[__module__].
    sys.modules[module.__name__] = module
    token = bind(Slot(conn))
    try:
        compiled = compile(code, f"<env {env_name}>", "exec")
        with warnings.catch_warnings(), _confine.restricted():
            warnings.simplefilter("ignore")
            exec(compiled, module.__dict__)
    except BaseException as exc:  # noqa: BLE001 - any failure of generated code is a load error
        sys.modules.pop(module.__name__, None)
        raise EnvLoadError(f"env {env_name!r} failed to load: {type(exc).__name__}: {exc}",
                           env=env_name) from exc
    finally:
        unbind(token)
    if conn.in_transaction:
        conn.commit()
    module.__dict__["__envfarm_engine__"] = engine
    return module


def find_app(env_name: str, module: types.ModuleType):
    from fastapi import FastAPI

    app = module.__dict__.get("app")
    if not isinstance(app, FastAPI):
        apps = [v for v in module.__dict__.values() if isinstance(v, FastAPI)]
        if len(apps) != 1:
            raise EnvLoadError(f"env {env_name!r} defines {len(apps)} FastAPI apps; expected one "
                               "(named 'app')", env=env_name)
        app = apps[0]
    _track_sync_endpoints(app)
    return app


def _track_sync_endpoints(app) -> None:
    """Sync handlers run on FastAPI's thread pool: mark those threads for the timeout watchdog."""
    from fastapi.routing import APIRoute

    for route in app.routes:
        call = getattr(getattr(route, "dependant", None), "call", None)
        if not isinstance(route, APIRoute) or call is None:
            continue
        if asyncio.iscoroutinefunction(call) or inspect.isasyncgenfunction(call):
            continue
        if getattr(call, "__envfarm_tracked__", False):
            continue
        route.dependant.call = _tracked(call)


def _tracked(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        guard = _guard.current_guard()
        if guard is None:
            return fn(*args, **kwargs)
        try:
            guard.enter()
            return fn(*args, **kwargs)
        finally:
            guard.exit()

    wrapper.__envfarm_tracked__ = True
    return wrapper
