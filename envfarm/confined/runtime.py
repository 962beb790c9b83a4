"""The environment runtime: one compiled env, many isolated instances (no Ray here).

An ``EnvRuntime`` compiles an env's code once and builds its initial database once, as bytes.
Each ``Instance`` owns an in-memory SQLite connection restored from those bytes; a reset is one
``deserialize``. Calls are routed in-process through ASGI and always come back as a
``CallResult``: agent mistakes and env faults are typed outcomes, never host crashes.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from envfarm.asgi import asgi_request, decode_body
from envfarm.confined import _binding, _confine, _guard, _sqlite_guard
from envfarm.confined._guard import Tracked
from envfarm.confined._tools import (
    Operation,
    extract_operations,
    openapi_as_fastapi_mcp,
    openapi_for_tools,
)
from envfarm.confined.dbrows import without_rows
from envfarm.confined.template import TemplateBuild, build_template, open_memory_db
from envfarm.errors import AgentError, EnvLoadError
from envfarm.models import CallResult, EnvBundle, ToolError, ToolSpec

DEFAULT_CALL_TIMEOUT_S = 10.0
MAX_PAYLOAD_BYTES = 1 << 20
#: How long the tasks a call spawned get to unwind after it was cancelled, inside the call.
SPAWNED_TASK_GRACE_S = 0.2
#: The database header's fields a write may change without changing ``total_changes`` (one
#: pragma each: a join of the three table-valued pragmas costs 3x as much).
_HEADER_FIELDS = ("PRAGMA schema_version", "PRAGMA user_version", "PRAGMA application_id")


#: ``Instance._saved``'s key of state restored from bytes whose key is not read yet.
_UNREAD = object()
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _check_image(data: bytes) -> None:
    """``sqlite3.DatabaseError`` unless ``data`` looks like a whole SQLite database image: the
    magic, a valid page size, whole pages."""
    if len(data) < 100 or not data.startswith(_SQLITE_MAGIC):
        raise sqlite3.DatabaseError("not a SQLite database image")
    page = int.from_bytes(data[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page & (page - 1) or len(data) % page:
        raise sqlite3.DatabaseError(f"not a whole SQLite database image (page size {page}, "
                                    f"{len(data)} bytes)")


class EnvRuntime:
    """One environment, loaded once per process."""

    def __init__(self, bundle: EnvBundle, *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
                 max_payload_bytes: int = MAX_PAYLOAD_BYTES, foreign_keys: bool = False) -> None:
        """``foreign_keys``: enforce FKs during calls. Off by default, as in AWM's own servers
        (plain SQLAlchemy engines), which the generated code was validated against."""
        if bundle.code is None:
            raise EnvLoadError(f"env {bundle.name!r} has no code (gen_envs.jsonl) to serve",
                               env=bundle.name)
        self.bundle = bundle
        self.name = bundle.name
        self.call_timeout_s = call_timeout_s
        self.max_payload_bytes = max_payload_bytes
        self.foreign_keys = foreign_keys
        #: Calls that timed out: their code may still run (a thread spinning in C, say).
        self.timeouts = 0
        #: ``Instance._state_key`` of a fresh copy of the template (resets skip reading it).
        self.template_state_key: tuple | None = None
        self._task_initials: dict[int, bytes] = {}
        loaded: dict[str, Any] = {}

        def load(conn: sqlite3.Connection) -> None:
            loaded["module"] = _binding.load_module(bundle.name, bundle.code, conn)

        started = time.perf_counter()
        self.template: TemplateBuild = build_template(bundle.db_schema, bundle.sample_data,
                                                      before_inserts=load)
        self.module = loaded["module"]
        self.app = _binding.find_app(bundle.name, self.module)
        self._mcp_openapi = openapi_for_tools(self.app)
        self.operations, self.problems = extract_operations(self.app, self._mcp_openapi)
        self.problems += self.template.errors
        self.build_seconds = time.perf_counter() - started

    @property
    def tools(self) -> list[ToolSpec]:
        return [op.spec for op in self.operations.values()]

    def mcp_openapi(self) -> dict[str, Any]:
        """The app's OpenAPI as fastapi-mcp generates it (MCP listings are rendered from it);
        made once, with the tools where it can be (``openapi_for_tools``)."""
        if self._mcp_openapi is None:
            self._mcp_openapi = openapi_as_fastapi_mcp(self.app)
        return self._mcp_openapi

    def task_initial(self, task_idx: int | None) -> bytes:
        """The starting database of a task: the template, or the template without the rows its
        state drops (``EnvBundle.task_states``; built once per task)."""
        drop = self.bundle.task_states.get(task_idx) if task_idx is not None else None
        if not drop:
            return self.template.data
        if task_idx not in self._task_initials:
            self._task_initials[task_idx] = without_rows(self.template.data, drop)
        return self._task_initials[task_idx]

    def instance(self, initial: bytes | None = None) -> Instance:
        """A fresh instance of the template, or of ``initial`` (a task's own starting database:
        its resets go back there)."""
        return Instance(self, initial)


class Instance:
    """An isolated, instantly resettable copy of an environment's state."""

    def __init__(self, runtime: EnvRuntime, initial: bytes | None = None) -> None:
        self.runtime = runtime
        #: The state a reset goes back to: the template, or a task's own starting database.
        self.initial = runtime.template.data if initial is None else initial
        self._open(self.initial)
        #: Serializes calls, resets and snapshots on this instance.
        self.lock = asyncio.Lock()
        self.closed = False

    @property
    def tools(self) -> list[ToolSpec]:
        return self.runtime.tools

    # -- state ---------------------------------------------------------------------------------
    def reset(self, initial: bytes | None = None) -> None:
        """Back to the initial state (or to ``initial``, which becomes it: a task's own start,
        or the template again when a pool takes the instance back): a new connection (so
        PRAGMAs and other connection state set by env code go too) restored from the bytes."""
        if initial is not None:
            self.initial = initial
        self.conn.close()
        self._open(self.initial)

    def _open(self, data: bytes) -> None:
        self.conn = open_memory_db(self.runtime.foreign_keys)
        _sqlite_guard.harden(self.conn, _binding.owned_by_caller(self.conn))
        self.conn.deserialize(data)
        self._slot = _binding.Slot(self.conn)
        #: Only this instance's own calls (and the host) run statements on its connection.
        self.fence = _sqlite_guard.Fence(self.conn)
        if data is not self.runtime.template.data:
            key = _UNREAD  # read at the first call, before which nothing writes (a fork's)
        else:  # the same for every fresh copy: nothing written yet, same header
            if self.runtime.template_state_key is None:
                self.runtime.template_state_key = self._state_key()
            key = self.runtime.template_state_key
        self._saved: tuple[tuple, bytes] | None = (key, data)

    def _state_key(self) -> tuple:
        """Changes whenever the database's bytes may have: rows written (``total_changes``
        counts every INSERT/UPDATE/DELETE row, triggers' and rolled-back ones included), the
        schema, or the header's user fields."""
        with self.fence.host():
            return (self.conn.total_changes,
                    *(self.conn.execute(sql).fetchone()[0] for sql in _HEADER_FIELDS))

    def _rollback_point(self) -> bytes:
        """The current state as bytes to restore a failed call from. Reused while nothing was
        written since it was taken: most tool calls only read, and ``serialize`` copies the
        whole database (~100 µs for 260 KB in a call's flow; linear in its size)."""
        key = self._state_key()
        if self._saved is not None and self._saved[0] is _UNREAD:
            self._saved = (key, self._saved[1])  # opened from these bytes; no call ran since
        elif self._saved is None or self._saved[0] != key:
            self._saved = (key, self.conn.serialize())
        return self._saved[1]

    def snapshot(self) -> bytes:
        """The current state as SQLite database bytes."""
        return self.conn.serialize()

    def committed(self) -> bytes:
        """The state between calls as bytes: the same object while nothing was written (it is
        the next call's rollback point, so a worker shipping it costs no second copy)."""
        return self._rollback_point()

    def restore(self, data: bytes) -> None:
        """Take the state of ``data`` (another instance's ``snapshot``: a fork); a later
        ``reset`` still goes back to its initial state (the template, or its task's own). ``sqlite3.DatabaseError`` if ``data`` is
        not a database image (checked from its header: the cost of a reset, not of reading the
        schema, which its first call pays as a reset instance's does)."""
        _check_image(data)
        self._restore(data)

    def initial_snapshot(self) -> bytes:
        return self.initial

    def write_snapshots(self, folder: str | Path) -> tuple[Path, Path]:
        """Write ``initial.db`` and ``final.db`` for verifier code; returns their paths."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        initial, final = folder / "initial.db", folder / "final.db"
        initial.write_bytes(self.initial_snapshot())
        final.write_bytes(self.snapshot())
        return initial, final

    def close(self) -> None:
        self.closed = True
        self.conn.close()

    def _restore(self, data: bytes) -> None:
        # A new connection, not a deserialize into this one: a statement env code left open
        # would block that, and statements cached before a deserialize (3.11's sqlite3) can
        # crash when run after it. Connection state a failed call set (PRAGMAs) goes too.
        self.conn.close()
        self._open(data)

    # -- calls ---------------------------------------------------------------------------------
    async def call(self, tool: str, arguments: Any = None) -> CallResult:
        """Call a tool. Never raises for agent or env faults: see ``CallResult.error``."""
        started = time.perf_counter()
        try:
            op, request = self._prepare(tool, {} if arguments is None else arguments)
        except AgentError as exc:
            return _failed("agent_error", exc.message, None, started)
        async with self.lock:
            if self.closed:
                return _failed("env_error", "instance is closed", None, started)
            return await self._call_locked(op, request, started)

    def call_sync(self, tool: str, arguments: Any = None) -> CallResult:
        """``call`` for code without a running event loop."""
        return asyncio.run(self.call(tool, arguments))

    def _prepare(self, tool: str, arguments: Any) -> tuple[Operation, tuple]:
        op = self.runtime.operations.get(tool)
        if op is None:
            names = sorted(self.runtime.operations)
            hint = ", ".join(names[:40]) + (" ..." if len(names) > 40 else "")
            raise AgentError(f"unknown tool {tool!r}; available tools: {hint}")
        if not isinstance(arguments, dict):
            raise AgentError(f"arguments must be a JSON object, got {type(arguments).__name__}")
        size = len(json.dumps(arguments, default=str))
        if size > self.runtime.max_payload_bytes:
            raise AgentError(f"arguments are {size} bytes; the limit is "
                             f"{self.runtime.max_payload_bytes} bytes")
        return op, op.build_request(arguments)

    async def _call_locked(self, op: Operation, request: tuple, started: float) -> CallResult:
        try:
            before = self._rollback_point()
        except sqlite3.DatabaseError as exc:  # a restored image SQLite cannot read
            return _failed("env_error", f"the instance's database cannot be read: {exc}", None,
                           started)
        fence = self.fence
        guard = _guard.CallGuard(self.runtime.call_timeout_s, self.conn, fence)
        _guard.track_tasks(asyncio.get_running_loop())
        token = _binding.bind(self._slot)
        _sqlite_guard.call_started(fence)
        try:
            answer = await self._run(op, request, guard, started)
        finally:
            _binding.unbind(token)
            _sqlite_guard.call_ended(fence)
        return self._finish(op, answer, started, before)

    async def _run(self, op: Operation, request: tuple, guard: _guard.CallGuard,
                   started: float) -> tuple[Any, int | None]:
        """Where a tool call finally runs: the env's generated app answers one in-process ASGI
        request, here, inside the jailed worker (or a failed ``CallResult``), and its status."""
        path, query, body = request
        timeout = self.runtime.call_timeout_s
        status: int | None = None
        try:
            with _confine.guarded(guard):
                try:
                    async with asyncio.timeout(timeout):
                        coro = asgi_request(self.runtime.app, op.method, path, query, body)
                        status, raw, content_type = await Tracked(coro, guard)
                finally:
                    if guard.tasks:  # nothing the call started outlives it
                        await guard.stop_tasks(SPAWNED_TASK_GRACE_S)
            if guard.fired:  # some of its code (a spawned task, say) ran past the deadline
                raise _guard.CallTimeout
            result = decode_body(raw, content_type)
        except (_guard.CallTimeout, TimeoutError):
            self.runtime.timeouts += 1
            _sqlite_guard.some_call_timed_out()
            result = _failed("env_error", f"tool {op.spec.name!r} timed out after {timeout:g} s",
                             status, started)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the host cancelled this call: not the env code's doing
            result = _failed("env_error", f"tool {op.spec.name!r} raised CancelledError",
                             status, started)
        except BaseException as exc:  # noqa: BLE001 - env code may raise anything, SystemExit too
            result = _failed("env_error", f"tool {op.spec.name!r} raised {type(exc).__name__}: "
                             f"{_clip(str(exc))}", status, started)
        return result, status

    def _finish(self, op: Operation, answer: tuple[Any, int | None], started: float,
                before: bytes) -> CallResult:
        result, status = answer
        if isinstance(result, CallResult) or status is None or status >= 400:
            self._restore(before)  # a failed call leaves no partial writes behind
            if isinstance(result, CallResult):
                return result
            kind = "agent_error" if status < 500 else "env_error"
            return _failed(kind, _error_message(op.spec.name, status, result), status, started)
        if self.conn.in_transaction:
            with self.fence.host():
                self.conn.rollback()  # uncommitted work is lost, as with a real server
        return CallResult(ok=True, result=result, status=status,
                          elapsed_ms=(time.perf_counter() - started) * 1000)


def _failed(kind: str, message: str, status: int | None, started: float) -> CallResult:
    return CallResult(ok=False, error=ToolError(kind=kind, message=message), status=status,
                      elapsed_ms=(time.perf_counter() - started) * 1000)


def _error_message(tool: str, status: int, body: Any) -> str:
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if status == 422 and isinstance(detail, list):
        parts = []
        for err in detail:
            if isinstance(err, dict):
                loc = [str(x) for x in err.get("loc", []) if x not in ("body", "query", "path")]
                where = f"argument {'.'.join(loc)!r}: " if loc else ""
                got = f" (got {err['input']!r})" if "input" in err and loc else ""
                parts.append(f"{where}{err.get('msg', err)}{_clip(got, 80)}")
        return f"tool {tool!r} rejected its arguments: " + "; ".join(parts)
    text = detail if isinstance(detail, str) else json.dumps(detail, default=str)
    return f"tool {tool!r} answered HTTP {status}: {_clip(text)}"


def _clip(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
