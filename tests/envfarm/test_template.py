from __future__ import annotations

import sqlite3

from envfarm import build_template
from envfarm.models import DBSchema, SampleData

from tests.fakes.toy_env import SAMPLE, SCHEMA


def _rows(data: bytes, sql: str):
    conn = sqlite3.connect(":memory:")
    conn.deserialize(data)
    return conn.execute(sql).fetchall()


def test_inserts_run_in_foreign_key_order():
    # SAMPLE lists notes (which reference users) before users.
    tb = build_template(DBSchema.model_validate(SCHEMA), SampleData.model_validate(SAMPLE))
    assert tb.errors == []
    assert (tb.tables, tb.rows, tb.statements) == (2, 4, 6)
    assert _rows(tb.data, "SELECT id, owner_id FROM notes ORDER BY id") == [(1, 1), (2, 2)]


def test_failing_statements_are_reported_not_fatal():
    sample = SampleData.model_validate({"tables": [
        {"table_name": "users", "insert_statements": [
            "INSERT INTO users (id, name) VALUES (1, 'ada');",
            "INSERT INTO users (id, nme) VALUES (2, 'typo');"]},
        {"table_name": "notes", "insert_statements": [
            "INSERT INTO notes (id, title, owner_id) VALUES (1, 'x', 99);"]},
    ]})
    schema = DBSchema.model_validate({"tables": [*SCHEMA["tables"],
                                                 {"name": "broken", "ddl": "CREATE TABLE (", "indexes": []}]})
    tb = build_template(schema, sample)
    assert len(tb.errors) == 3
    assert any("DDL for broken" in e for e in tb.errors)
    assert any("no column named nme" in e for e in tb.errors)
    assert any("FOREIGN KEY constraint failed" in e for e in tb.errors)
    assert tb.rows == 1 and abs(tb.failure_rate - 3 / 6) < 1e-9


def test_an_empty_catalog_entry_still_builds_a_database():
    tb = build_template(None, None)
    assert tb.tables == 0 and tb.rows == 0
    assert _rows(tb.data, "SELECT COUNT(*) FROM sqlite_master") == [(0,)]
