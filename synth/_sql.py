"""Executing generated DDL and INSERTs for real, statement by statement, to say which failed."""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from envfarm import build_template
from envfarm.confined.template import execute_inserts
from envfarm.models import DBSchema, SampleData

_INDEX_NAME = re.compile(r"create\s+(?:unique\s+)?index\s+(?:if\s+not\s+exists\s+)?[\"`\[]?(\w+)", re.I)


@dataclass
class DDLRun:
    """Which declared tables and indexes exist after running a schema."""

    kept: list[dict[str, Any]] = field(default_factory=list)
    failed_tables: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    total: int = 0

    @property
    def failure_rate(self) -> float:
        return len(self.failed_tables) / self.total if self.total else 1.0


def run_ddl(tables: list[dict[str, Any]]) -> DDLRun:
    """Run the schema through envfarm's ``build_template`` and keep what SQLite actually created."""
    schema = DBSchema.model_validate({"tables": tables})
    tb = build_template(schema, None)
    conn = sqlite3.connect(":memory:")
    conn.deserialize(tb.data)
    made_tables = {r[0].lower() for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    made_indexes = {r[0].lower() for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    conn.close()
    run = DDLRun(errors=list(tb.errors), total=len(tables))
    for t in tables:
        if t["name"].lower() not in made_tables:
            run.failed_tables.append(t["name"])
            if not any(e.startswith(f"DDL for {t['name']}:") for e in tb.errors):
                run.errors.append(f"table {t['name']!r} is declared but its DDL does not create it")
            continue
        indexes = [i for i in t.get("indexes", []) if (m := _INDEX_NAME.search(i)) and m.group(1).lower() in made_indexes]
        run.kept.append({"name": t["name"], "ddl": t["ddl"], "indexes": indexes})
    return run


@dataclass
class SampleRun:
    """What the sample stage's INSERTs did against their schema: which ran (in foreign-key order,
    ``PRAGMA foreign_keys=ON``) and which failed (``envfarm``'s ``InsertRun`` by statement)."""

    kept: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed: int = 0
    total: int = 0
    rows: int = 0

    @property
    def failure_rate(self) -> float:
        return self.failed / self.total if self.total else 1.0


def run_inserts(db_tables: list[dict[str, Any]], sample_tables: list[dict[str, Any]]) -> SampleRun:
    """Execute every INSERT against the schema; keep the ones that succeed, report the rest."""
    schema = DBSchema.model_validate({"tables": db_tables})
    conn = sqlite3.connect(":memory:")
    conn.deserialize(build_template(schema, None).data)
    run = SampleRun()
    done = execute_inserts(conn, [(t["table_name"], t.get("insert_statements", []))
                                  for t in sample_tables])
    ok = done.ok
    run.total, run.failed = done.total, len(done.failed)
    run.errors = [f"INSERT into {t} failed ({exc}): {s[:300]}" for t, _, s, exc in done.failed]
    run.kept = [
        {"table_name": t["table_name"], "reasoning": t.get("reasoning", ""),
         "insert_statements": [s for i, s in enumerate(t.get("insert_statements", [])) if (t["table_name"], i) in ok]}
        for t in sample_tables
    ]
    run.rows = len(ok)
    # The farm builds the same data through build_template: it must agree.
    check = build_template(schema, SampleData.model_validate({"tables": run.kept}))
    run.errors += [f"farm build: {e}" for e in check.errors]
    run.failed += len(check.errors)
    conn.close()
    return run


def ddl_text(db_tables: list[dict[str, Any]]) -> str:
    """The schema as SQL text for prompts."""
    return "\n".join(t["ddl"] for t in db_tables)
