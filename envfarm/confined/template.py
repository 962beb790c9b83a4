"""Build an environment's initial database once: DDL, then inserts in foreign-key order.

DDL and INSERTs are LLM-written SQL: every connection they run on is hardened first (no ATTACH,
no VACUUM INTO, no extensions; see ``_sqlite_guard``), whoever opened it.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field

from envfarm.confined._sqlite_guard import connect_memory, harden
from envfarm.models import DBSchema, SampleData


@dataclass
class TemplateBuild:
    """A built initial database as serialized bytes, plus what went wrong on the way."""

    data: bytes
    errors: list[str] = field(default_factory=list)
    statements: int = 0
    tables: int = 0
    rows: int = 0

    @property
    def failure_rate(self) -> float:
        return len(self.errors) / self.statements if self.statements else 0.0


def open_memory_db(foreign_keys: bool = True) -> sqlite3.Connection:
    # check_same_thread=False: sync env handlers run on worker threads; calls are serialized.
    conn = connect_memory(check_same_thread=False)
    conn.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
    return conn


def build_template(
    db_schema: DBSchema | None,
    sample_data: SampleData | None,
    conn: sqlite3.Connection | None = None,
    *,
    before_inserts=None,
) -> TemplateBuild:
    """Execute DDL and inserts into ``conn`` (a fresh in-memory DB by default).

    ``before_inserts(conn)`` runs between DDL and inserts: the runtime uses it to let the env's
    own ``create_all`` add tables that the DDL lacks (some AWM envs only define them in code).
    """
    conn = harden(conn or open_memory_db())
    errors: list[str] = []
    statements = 0
    for table in db_schema.tables if db_schema else []:
        for sql in [table.ddl, *table.indexes]:
            statements += 1
            try:
                conn.executescript(sql)
            except sqlite3.Error as exc:
                errors.append(f"DDL for {table.name}: {exc}")
    if before_inserts is not None:
        before_inserts(conn)
    inserts = execute_inserts(
        conn, [(t.table_name, t.insert_statements) for t in sample_data.tables] if sample_data else [])
    statements += inserts.total
    errors += [f"INSERT into {t}: {exc}" for t, _, _, exc in inserts.failed]
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                         "AND name NOT LIKE 'sqlite_%'")]
    rows = sum(conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables)
    if not tables:  # an empty database has no pages, and SQLite cannot serialize it
        conn.executescript("CREATE TABLE _envfarm_empty (x); DROP TABLE _envfarm_empty;")
    conn.commit()
    return TemplateBuild(conn.serialize(), errors, statements, len(tables), rows)


@dataclass
class InsertRun:
    """What ``execute_inserts`` did: which statements ran, which failed and why."""

    ok: set[tuple[str, int]] = field(default_factory=set)  # (table, index in its list)
    failed: list[tuple[str, int, str, sqlite3.Error]] = field(default_factory=list)
    total: int = 0


def execute_inserts(conn: sqlite3.Connection, tables: list[tuple[str, list[str]]]) -> InsertRun:
    """Run INSERTs with ``PRAGMA foreign_keys=ON``, referenced tables first, committing each pass.

    Failed statements get further passes while any pass makes progress: sample data is not always
    FK-ordered within a table, and a later row may satisfy an earlier one's reference.
    """
    harden(conn)
    conn.execute("PRAGMA foreign_keys=ON")
    run = InsertRun()
    pending = [(name, i, sql) for name, stmts in _fk_order(conn, tables)
               for i, sql in enumerate(stmts)]
    run.total = len(pending)
    while pending:
        failed = []
        for name, i, sql in pending:
            try:
                conn.execute(sql)
                run.ok.add((name, i))
            except sqlite3.Error as exc:
                failed.append((name, i, sql, exc))
        conn.commit()
        if len(failed) == len(pending):
            run.failed = failed
            break
        pending = [(name, i, sql) for name, i, sql, _ in failed]
    return run


def _fk_order(conn: sqlite3.Connection, tables: list[tuple[str, list[str]]]) -> list:
    """Order tables so referenced ones come first (cycles keep their given order)."""
    names = {name for name, _ in tables}
    deps: dict[str, set[str]] = {}
    for name, _ in tables:
        try:
            refs = {r[2] for r in conn.execute(f"PRAGMA foreign_key_list(\"{_ident(name)}\")")}
        except sqlite3.Error:
            refs = set()
        deps[name] = {r for r in refs if r in names and r != name}
    ordered, done = [], set()
    remaining = list(tables)
    while remaining:
        ready = [t for t in remaining if deps[t[0]] <= done] or [remaining[0]]
        for t in ready:
            ordered.append(t)
            done.add(t[0])
            remaining.remove(t)
    return ordered


def _ident(name: str) -> str:
    return re.sub(r'"', '""', name)
