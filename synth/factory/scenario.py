"""Per-scenario starting state, as EnvFactory derives one (Section 3.3, Planning): each chain's
scenario starts from a database of its own instead of the env's shared sample data.

The state is derived from the sample data, deterministically per scenario (the chain's id): each
row that no other row references (a booking, a review, a message, a card on file: not a hotel its
rooms hang on) is kept with probability ``keep``, except the acting user's own row and the rows of
small tables (lookups: at most ``SMALL_TABLE`` rows). No foreign key is left dangling, so the
state conforms to the schema. The chain then runs on it, its verifier compares against it, and the farm serves the
task from it (``EnvBundle.task_states``: the rows it drops). Two scenarios of one env see
different hotels, bookings and cards, so a policy cannot memorize one world's answers.
"""

from __future__ import annotations

import random
from typing import Any

from envfarm.dbrows import table_rows, without_rows
from synth.factory.consistent import relations
from synth.factory.dbvalues import foreign_keys

#: tables with at most this many rows are kept whole (lookups, an acting user's one account)
SMALL_TABLE = 3
DEFAULT_KEEP = 0.75


def scenario_drop(data: bytes, code: str, seed: str, keep: float = DEFAULT_KEEP) -> dict[str, list[int]]:
    """table -> rowids the scenario ``seed``'s starting state lacks (module doc); {} keeps all."""
    rows = table_rows(data)
    rng = random.Random(f"scenario:{seed}")
    user = relations(data, code).user
    held = _referenced(rows, foreign_keys(data))
    drop: dict[str, list[int]] = {}
    for table in sorted(rows):
        if len(rows[table]) <= SMALL_TABLE:
            continue
        for rowid, row in sorted(rows[table].items()):
            mine = user is not None and table == user[0] and row == user[1]
            if not mine and (table, rowid) not in held and rng.random() >= keep:
                drop.setdefault(table, []).append(rowid)
        if len(drop.get(table, [])) >= len(rows[table]):  # never a whole table
            drop[table].pop()
    return {t: r for t, r in drop.items() if r}


def _referenced(rows: dict[str, dict[int, dict[str, Any]]], keys: list[tuple[str, str, str, str]]
                ) -> set[tuple[str, int]]:
    """(table, rowid) of every row another row references through a foreign key."""
    out: set[tuple[str, int]] = set()
    for table, column, ref_table, ref_column in keys:
        values = {row.get(column) for row in rows.get(table, {}).values()} - {None}
        out |= {(ref_table, rowid) for rowid, row in rows.get(ref_table, {}).items() if row.get(ref_column) in values}
    return out


def scenario_state(data: bytes, code: str, seed: str, keep: float = DEFAULT_KEEP
                   ) -> tuple[dict[str, list[int]], bytes]:
    """(the rows dropped, the starting database) of scenario ``seed``."""
    drop = scenario_drop(data, code, seed, keep)
    return drop, (without_rows(data, drop) if drop else data)
