"""Build an environment's initial database once: DDL, then inserts in foreign-key order."""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field

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
    conn = sqlite3.connect(":memory:", check_same_thread=False)
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
    conn = conn or open_memory_db()
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
    conn.execute("PRAGMA foreign_keys=ON")
    pending = [
        (t.table_name, sql)
        for t in _fk_order(conn, sample_data.tables if sample_data else [])
        for sql in t.insert_statements
    ]
    statements += len(pending)
    # Retry failures once more after everything else: sample data is not always FK-ordered
    # within a table, and a later row may satisfy an earlier one's reference.
    for attempt in range(2):
        failed = []
        for table_name, sql in pending:
            try:
                conn.execute(sql)
            except sqlite3.Error as exc:
                failed.append((table_name, sql, exc))
        conn.commit()
        pending = [(t, s) for t, s, _ in failed]
        if not failed or attempt == 1:
            errors += [f"INSERT into {t}: {exc}" for t, _, exc in failed]
            break
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                         "AND name NOT LIKE 'sqlite_%'")]
    rows = sum(conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables)
    if not tables:  # an empty database has no pages, and SQLite cannot serialize it
        conn.executescript("CREATE TABLE _envfarm_empty (x); DROP TABLE _envfarm_empty;")
    conn.commit()
    return TemplateBuild(conn.serialize(), errors, statements, len(tables), rows)


def _fk_order(conn: sqlite3.Connection, samples: list) -> list:
    """Order sample tables so referenced tables come first (cycles keep their given order)."""
    names = {s.table_name for s in samples}
    deps: dict[str, set[str]] = {}
    for s in samples:
        try:
            refs = {r[2] for r in conn.execute(f"PRAGMA foreign_key_list(\"{_ident(s.table_name)}\")")}
        except sqlite3.Error:
            refs = set()
        deps[s.table_name] = {r for r in refs if r in names and r != s.table_name}
    ordered, done = [], set()
    remaining = list(samples)
    while remaining:
        ready = [s for s in remaining if deps[s.table_name] <= done]
        if not ready:  # a cycle: take the next one as given
            ready = [remaining[0]]
        for s in ready:
            ordered.append(s)
            done.add(s.table_name)
            remaining.remove(s)
    return ordered


def _ident(name: str) -> str:
    return re.sub(r'"', '""', name)
