"""Values of one chain that belong together: drawn from rows consistent with the rows already used.

Ids drawn independently rarely fit: a reservation of another user, a room type of another hotel, a
card that pays nothing. So a chain's draw keeps *pins*: the rows its values came from (a drawn id,
or an id an earlier call returned, located in its table), each pin also pinning the rows it
references through the database's foreign keys. A later value is drawn from the rows that agree
with every pin: a row referencing a pinned row must reference that one (``room_types.hotel_id`` =
the pinned hotel), a row a pin references must be that one, a pinned table gives its pinned row.
When the env acts for a fixed user (``CURRENT_USER_ID = 1`` in its code, as the bundled envs do), that
user's row is pinned from the start, so ids are the user's own. When no row agrees, the draw falls
back to any row and says so (``unpinned``), rather than dropping a chain the env might accept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from envfarm.dbrows import table_rows
from synth.factory.dbvalues import foreign_keys

_ACTING_USER = re.compile(r"^\s*CURRENT_USER(?:_ID)?\s*(?::\s*int\s*)?=\s*(\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class ForeignKey:
    table: str
    column: str
    ref_table: str
    ref_column: str


@dataclass
class Relations:
    """An env's initial rows and foreign keys (read once per template)."""

    rows: dict[str, list[dict[str, Any]]]
    keys: list[ForeignKey]
    #: the acting user's (table, row) when the env's code fixes one
    user: tuple[str, dict[str, Any]] | None = None


@lru_cache(maxsize=8)
def relations(data: bytes, code: str = "") -> Relations:
    rows = {table: list(by_rowid.values()) for table, by_rowid in table_rows(data).items()}
    rel = Relations(rows=rows, keys=[ForeignKey(*k) for k in foreign_keys(data)])
    match = _ACTING_USER.search(code)
    if match:
        rel.user = _user_row(rel, int(match.group(1)))
    return rel


def _user_row(rel: Relations, user_id: int) -> tuple[str, dict[str, Any]] | None:
    targets = [k.ref_table for k in rel.keys if k.column.lower() == "user_id"] + ["users"]
    for table in targets:
        for row in rel.rows.get(table, []):
            if row.get("id") == user_id:
                return table, row
    return None


@dataclass
class Draw:
    """One chain's draw: the pinned rows and how often no row agreed with them."""

    rel: Relations
    pins: dict[str, dict[str, Any]] = field(default_factory=dict)
    unpinned: int = 0

    def __post_init__(self) -> None:
        if self.rel.user:
            self.pin(*self.rel.user)

    def pin(self, table: str, row: dict[str, Any], depth: int = 0) -> None:
        """Pin ``row`` and, through foreign keys, the rows it references (not through a table's several
        keys to one table: a sender or a recipient is not "the" user)."""
        if table in self.pins or depth > 6:
            return
        self.pins[table] = row
        for k in self.rel.keys:
            ambiguous = sum(o.table == table and o.ref_table == k.ref_table for o in self.rel.keys) > 1
            if k.table == table and not ambiguous and k.ref_table not in self.pins and row.get(k.column) is not None:
                ref = next((r for r in self.rel.rows.get(k.ref_table, []) if r.get(k.ref_column) == row[k.column]), None)
                if ref is not None:
                    self.pin(k.ref_table, ref, depth + 1)

    def fits(self, table: str, row: dict[str, Any]) -> bool:
        if table in self.pins:
            return self.pins[table] == row
        # this row references a pinned table: through at least one of its keys to it, that pinned row
        # (an issue reported *or* assigned to the user; a single key is plain equality)
        refs: dict[str, list[bool]] = {}
        for k in self.rel.keys:
            if k.table == table and k.ref_table in self.pins and row.get(k.column) is not None:
                refs.setdefault(k.ref_table, []).append(row[k.column] == self.pins[k.ref_table].get(k.ref_column))
        # a pinned row references this table: this row must be one it references
        for k in self.rel.keys:
            pinned = self.pins.get(k.table) if k.ref_table == table else None
            if pinned is not None and pinned.get(k.column) is not None:
                refs.setdefault(f"<-{k.table}", []).append(pinned[k.column] == row.get(k.ref_column))
        return all(any(matches) for matches in refs.values())

    def column(self, table: str, column: str) -> list[Any]:
        """Distinct values of ``table.column`` in rows that agree with the pins (all rows when none
        does, counted as ``unpinned``)."""
        rows = self.rel.rows.get(table, [])
        agree = [r for r in rows if r.get(column) is not None and self.fits(table, r)]
        if not agree:
            agree = [r for r in rows if r.get(column) is not None]
            self.unpinned += bool(agree)
        return list(dict.fromkeys(r[column] for r in agree if not isinstance(r[column], (dict, list))))

    def prefer(self, table: str, column: str, options: list[Any]) -> list[Any]:
        """The ``options`` (values an earlier call returned) whose row in ``table`` agrees with the pins;
        all of them when none does (or the values are not in the table)."""
        agree = {r.get(column) for r in self.rel.rows.get(table, []) if self.fits(table, r)}
        chosen = [v for v in options if v in agree]
        self.unpinned += bool(options) and not chosen
        return chosen or options

    def took(self, table: str, column: str, value: Any) -> None:
        """``value`` was used for ``table.column``: pin its row (the first agreeing one)."""
        rows = [r for r in self.rel.rows.get(table, []) if r.get(column) == value]
        row = next((r for r in rows if self.fits(table, r)), rows[0] if rows else None)
        if row is not None and table not in self.pins:
            self.pin(table, row)
