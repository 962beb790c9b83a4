"""Which initial-database column can supply a tool parameter (``hotel_id`` -> ``hotels.id``)."""

from __future__ import annotations

import re
import sqlite3

from envfarm.template import open_memory_db
from synth.factory.candidates import singular

#: table -> column -> number of distinct non-null values in the initial database
DbColumns = dict[str, dict[str, int]]


def db_columns(data: bytes) -> DbColumns:
    """Columns that hold at least one value in a serialized SQLite database (a runtime's template)."""
    conn = open_memory_db(False)
    try:
        conn.deserialize(data)
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        out: DbColumns = {}
        for table in tables:
            cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
            counts = {}
            for col in cols:
                try:
                    (n,) = conn.execute(f'SELECT COUNT(DISTINCT "{col}") FROM "{table}"').fetchone()
                except sqlite3.Error:
                    continue
                if n:
                    counts[col] = int(n)
            if counts:
                out[table] = counts
        return out
    finally:
        conn.close()


def column_values(data: bytes, table: str, column: str, limit: int = 50) -> list[object]:
    """Distinct non-null values of ``table.column`` in a serialized database, in row order
    (the concrete arguments of a ``db`` binding); [] when the table or column does not exist."""
    conn = open_memory_db(False)
    try:
        conn.deserialize(data)
        rows = conn.execute(f'SELECT DISTINCT "{column}" FROM "{table}" WHERE "{column}" IS NOT NULL '
                            f"ORDER BY rowid LIMIT ?", (limit,)).fetchall()
        return [r[0] for r in rows]
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def db_source(param: str, columns: DbColumns) -> tuple[str, str] | None:
    """``(table, column)`` whose values fit ``param``: the ``id`` of the entity's own table first
    (``room_type_id`` -> ``room_types.id``), else a column of the same name in any table."""
    name = param.lower()
    if name.endswith("_id") and len(name) > 3:
        entity = name[:-3]
        for table in sorted(columns):
            words = singular(table.lower())
            if (words == entity or words.endswith("_" + entity)) and "id" in columns[table]:
                return table, "id"
    for table in sorted(columns):
        for col in sorted(columns[table]):
            if col.lower() == name:
                return table, col
    return None


def strict_id(param: str) -> bool:
    """A surrogate key: only data can supply it (a user does not know ``hotel_id = 17``)."""
    return re.search(r"(^|_)id$", param.lower()) is not None


def foreign_keys(data: bytes) -> list[tuple[str, str, str, str]]:
    """(table, column, referenced table, referenced column) of a serialized database."""
    conn = open_memory_db(False)
    try:
        conn.deserialize(data)
        out = []
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"):
            pk = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")') if r[5]]
            for fk in conn.execute(f'PRAGMA foreign_key_list("{table}")'):
                out.append((table, fk[3], fk[2], fk[4] or (pk[0] if pk else "id")))
        return out
    finally:
        conn.close()
