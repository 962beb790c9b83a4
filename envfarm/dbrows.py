"""Rows of a serialized SQLite database, and which rows differ between two of them.

The probes (``envfarm.hackprobes``) and synthesis read env databases as bytes (a runtime's
template, an instance's snapshot); these helpers open them in memory, never on disk.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from envfarm.template import open_memory_db

#: table -> rowid -> row (column -> value)
Rows = dict[str, dict[int, dict[str, Any]]]


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]


def table_rows(data: bytes) -> Rows:
    """table -> rowid -> row of a serialized database (tables without rowid are skipped)."""
    conn = open_memory_db(False)
    try:
        conn.deserialize(data)
        out: Rows = {}
        for table in _tables(conn):
            try:
                cur = conn.execute(f'SELECT rowid AS "__rowid", * FROM "{table}"')
            except sqlite3.Error:
                continue
            cols = [d[0] for d in cur.description]
            out[table] = {row[0]: dict(zip(cols[1:], row[1:], strict=True)) for row in cur.fetchall()}
        return out
    finally:
        conn.close()


def changed_rows(before: bytes | Rows, after: bytes | Rows) -> set[tuple[str, int]]:
    """(table, rowid) of every row added, deleted or changed between two databases."""
    a = table_rows(before) if isinstance(before, bytes) else before
    b = table_rows(after) if isinstance(after, bytes) else after
    out: set[tuple[str, int]] = set()
    for table in set(a) | set(b):
        ra, rb = a.get(table, {}), b.get(table, {})
        out |= {(table, rowid) for rowid in set(ra) | set(rb) if ra.get(rowid) != rb.get(rowid)}
    return out


def delete_row(data: bytes, table: str, rowid: int) -> bytes:
    """``data`` without one row (foreign keys off, as the env's own calls run)."""
    return without_rows(data, {table: [rowid]})


def without_rows(data: bytes, drop: dict[str, list[int]]) -> bytes:
    """``data`` without the rows ``drop`` names (table -> rowids); foreign keys off."""
    conn = open_memory_db(False)
    try:
        conn.deserialize(data)
        tables = set(_tables(conn))
        for table, rowids in sorted(drop.items()):
            if table in tables and rowids:
                conn.executemany(f'DELETE FROM "{table}" WHERE rowid = ?', [(r,) for r in rowids])
        conn.commit()
        return conn.serialize()
    finally:
        conn.close()
