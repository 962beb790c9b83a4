"""Does the written request single out everything the chain acted on?

An agent that sees only the request resolves a reference by reading: it lists or searches, then
picks the record the request describes. A chain step that used a record the user never named
("delete payment method": which of three?) cannot be redone by an honest agent; it passes only
an agent that replays the chain, or one that guesses. So, for every id the chain passed that the
user did not state, and for the record a question's answer is read from:

- the candidates are the records the agent could have meant: the items of the earlier answer the
  id came from (a list the agent reads too), else the rows of the table the id belongs to (the
  acting user's own, when the env acts for a fixed user and the table has a ``user_id``);
- the request singles the used record out when the values of it that the request states (as
  whole words: a name, a date, an amount) fit no other candidate, when it is the only
  candidate, or when the request speaks of an order ("my latest booking", "the first one") and
  the record is first or last of the candidates by id or by a date.
"""

from __future__ import annotations

import re
from typing import Any

from synth.factory.consistent import Relations, relations
from synth.factory.dbvalues import DbColumns, db_source, strict_id
from synth.factory.execute import Executed
from synth.factory.verifier import states

#: words that pick one record of several by order
_ORDER = re.compile(r"\b(latest|last|newest|most recent|first|oldest|earliest|next|upcoming)\b", re.IGNORECASE)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def unresolved(ex: Executed, messages: list[str], data: bytes, columns: DbColumns,
               answer: tuple[str, Any] | None = None, code: str = "") -> str | None:
    """Why the request leaves a reference open (the first one found), or None. ``code``: the
    env's code (it may fix the acting user)."""
    text = " ".join(messages)
    rel: Relations | None = None
    for i, call in enumerate(ex.calls):
        for key, value in call.arguments.items():
            if not strict_id(key) or key in ex.stated or isinstance(value, (dict, list)):
                continue
            found = _from_answers(ex, i, key, value, key[:-3].rstrip("_"))
            if found is None:
                rel = rel or relations(data, code)
                found = _from_table(rel, columns, key, value)
            if found is not None and not _singled_out(text, *found):
                chosen, candidates = found
                return (f"step {i} {call.tool}: {key}={value!r} is one of {len(candidates)} candidates "
                        "and the request names nothing that tells it from the others")
    if answer is not None:
        found = _answer_record(ex.calls[-1].result, answer[0])
        if found is not None and not _singled_out(text, *found):
            return (f"the answer is read from one of {len(found[1])} records and the request names "
                    "nothing that tells it from the others")
    return None


def _records(value: Any) -> list[list[dict[str, Any]]]:
    """Every list of records (dicts) in a tool's answer; a record outside a list is a list of one."""
    if isinstance(value, list):
        items = [v for v in value if isinstance(v, dict)]
        return ([items] if items else []) + [r for v in value for r in _records(v)]
    if isinstance(value, dict):
        return [[value]] + [r for v in value.values() for r in _records(v)]
    return []


def _from_answers(ex: Executed, step: int, key: str, value: Any, entity: str
                  ) -> tuple[list[dict], list[dict]] | None:
    """(chosen, candidates) from the latest earlier answer holding a record with that id: a
    single record holding it under its own name (what a step made: ``{"loan_id": 2, ...}``), or
    as ``id`` in an answer of a tool about that thing (``list_wishlists`` for a ``wishlist_id``)."""
    for field in (key, "id"):
        for call in reversed(ex.calls[:step]):
            if field == "id" and not (entity and singular_stem(entity) in call.tool):
                continue
            for group in _records(call.result):
                if field == key and len(group) > 1:
                    continue  # records that point to the thing (reservations' payment_method_id)
                chosen = [r for r in group if r.get(field) == value]
                if chosen:
                    return chosen, group
    return None


def singular_stem(entity: str) -> str:
    return entity[:-1] if entity.endswith("s") else entity


def _from_table(rel: Relations, columns: DbColumns, key: str, value: Any) -> tuple[list[dict], list[dict]] | None:
    where = db_source(key, columns)
    if where is None or where[0] not in rel.rows:
        return None
    candidates = rel.rows[where[0]]
    if rel.user is not None and any("user_id" in r for r in candidates):  # the acting user's own
        candidates = [r for r in candidates if r.get("user_id") == rel.user[1].get("id")]
    chosen = [r for r in candidates if r.get(where[1]) == value]
    return (chosen, candidates) if chosen else None


def _answer_record(result: Any, path: str) -> tuple[list[dict], list[dict]] | None:
    """(the record the answer is read from, its siblings) when the answer field is in a list."""
    leaf = path.rsplit(".", 1)[-1].strip("[]")
    for group in _records(result):
        holders = [r for r in group if leaf in r]
        if len(holders) > 1:
            return [holders[0]], holders
    return None


def _said(value: Any) -> bool:
    """A value a request can name: text of 3+ characters, or a number that is not a small count."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, str):
        return len(value.strip()) >= 3
    return isinstance(value, (int, float)) and (abs(value) >= 100 or value != int(value))


def _singled_out(text: str, chosen: list[dict], candidates: list[dict]) -> bool:
    if len({id(c) for c in candidates}) <= len(chosen) or _by_order(text, chosen, candidates):
        return True
    named = {str(v).lower(): v for row in chosen for v in row.values() if _said(v) and states(text, v)}
    if not named:
        return False
    fits = [c for c in candidates
            if all(any(_same(v, w) for w in c.values()) for v in named.values())]
    return len(fits) <= len(chosen)


def _by_order(text: str, chosen: list[dict], candidates: list[dict]) -> bool:
    """The request speaks of an order and the record is first or last by id or by a date."""
    if not _ORDER.search(text) or len(chosen) != 1:
        return False
    keys = ["id"] + [k for k, v in chosen[0].items() if isinstance(v, str) and _DATE.match(v)]
    for key in keys:
        values = sorted(str(c[key]) if key != "id" else c[key] for c in candidates
                        if c.get(key) is not None and type(c.get(key)) is type(chosen[0].get(key)))
        mine = chosen[0].get(key) if key == "id" else str(chosen[0].get(key))
        if values and mine in (values[0], values[-1]) and values.count(mine) == 1:
            return True
    return False


def _same(a: Any, b: Any) -> bool:
    return str(a).strip().lower() == str(b).strip().lower()
