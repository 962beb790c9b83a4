"""AWM code-mode verifiers templated from an executed chain's end state, exact both ways.

A chain that wrote checks the rows it changed: each row it added is new in the final database
(matched on its stable columns, one new row per added row), each changed row has its new values,
each deleted row is gone, and **every other row of every table is as it was**: no row added,
changed or deleted beyond what the task asks (tables the env's read tools write, an access log,
are left out). A read-only chain checks that the database is unchanged and that the final answer
states the key value the last call returned exactly (the same number, or the text as whole
words: "10" does not state "0") and **no other candidate** of it (the other values of the same
column and of the same field of the answer): an answer that dumps every value fails. 0/1 are
never that value (a guess says them). Columns whose values differ between two executions of the
same chain (random codes), that are named like timestamps, or that hold a time the env stamped
(now, today: two runs in one second agree on it) are left out, so a replay at another time still
passes. The code runs only in the judge's sandbox.
"""

from __future__ import annotations

import datetime
import inspect
import re
from typing import Any

from synth.factory.fields import field_values, value_fields

_VOLATILE_NAME = re.compile(r"(_at|_on|time|timestamp|created|updated|token|uuid)$", re.IGNORECASE)
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}")


def _clock_value(value: Any, given: set[str]) -> bool:
    """A time the env stamped (now, today), not one the calls passed: two runs in the same second
    agree on it, a replay later does not."""
    if not isinstance(value, str) or value in given:
        return False
    today = {datetime.date.today().isoformat(), datetime.datetime.now(datetime.UTC).date().isoformat()}
    return bool(_TIMESTAMP.match(value)) or value[:10] in today

_TEMPLATE = '''def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    EXPECTED = {expected!r}

    def matches(row, want):
        return all(row.get(k) == v for k, v in want.items())

    try:
        before, after = {reader}(initial_db_path), {reader}(final_db_path)
    except Exception as exc:
        return {{"result": "others", "reason": f"a database cannot be read: {{exc}}"}}
    for table in sorted(set(before) | set(after)):
        if table in EXPECTED.get("ignore", []):
            continue
        spec = EXPECTED.get("tables", {{}}).get(table, {{}})
        old, new = before.get(table, {{}}), after.get(table, {{}})
        added = [row for rowid, row in new.items() if rowid not in old]
        for want in spec.get("added", []):
            hit = next((row for row in added if matches(row, want)), None)
            if hit is None:
                return {{"result": "others", "reason": f"no new {{table}} row like {{want}}"}}
            added.remove(hit)
        if added:
            return {{"result": "others", "reason": f"{{len(added)}} {{table}} row(s) added that the task does not ask for"}}
        changed = dict(spec.get("changed", []))
        deleted = set(spec.get("deleted", []))
        for rowid, row in old.items():
            if rowid in deleted:
                if rowid in new:
                    return {{"result": "others", "reason": f"{{table}} row {{rowid}} still there"}}
            elif rowid not in new:
                return {{"result": "others", "reason": f"{{table}} row {{rowid}} deleted, which the task does not ask for"}}
            elif rowid in changed:
                if not matches(new[rowid], changed[rowid]):
                    return {{"result": "others", "reason": f"{{table}} row {{rowid}} lacks {{changed[rowid]}}"}}
            elif new[rowid] != row:
                return {{"result": "others", "reason": f"{{table}} row {{rowid}} changed, which the task does not ask for"}}
    if "answer" in EXPECTED:
        text = str(final_answer or "")
        if not states(text, EXPECTED["answer"]):
            return {{"result": "others", "reason": "the final answer does not state the requested value"}}
        also = [o for o in EXPECTED.get("others", []) if states(text, o)]
        if also:
            return {{"result": "others", "reason": f"the final answer also states other candidates: {{also[:5]}}"}}
    return {{"result": "complete"}}


'''


#: what generated verifiers call ``read_tables`` (a name no verifier of the catalog's own uses)
READER = "_envfarm_read_tables"


def reader_source() -> str:
    """``read_tables``'s source, named ``READER``."""
    return inspect.getsource(read_tables).replace("def read_tables(", f"def {READER}(", 1)


def read_tables(path: str) -> dict:
    """table -> rowid -> row (column -> value) of a database file, read only. Its source is part
    of every templated and guarded verifier, as ``READER`` (``reader_source``)."""
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
        out = {}
        for table in names:
            try:
                cur = conn.execute(f'SELECT rowid AS "__rowid", * FROM "{table}"')
            except sqlite3.Error:
                continue
            cols = [d[0] for d in cur.description]
            out[table] = {r[0]: dict(zip(cols[1:], r[1:], strict=True)) for r in cur.fetchall()}
        return out
    finally:
        conn.close()


def states(text: str, value: object) -> bool:
    """The answer states ``value`` exactly: the same number, or the text as whole words
    ("10" does not state "0"). Its source is part of every templated verifier."""
    import re

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        numbers = re.findall(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w])", text)
        return any(abs(float(n.replace(",", "")) - value) < 1e-9 for n in numbers)
    want = re.escape(str(value).strip().lower())
    return re.search(r"(?<!\w)" + want + r"(?!\w)", text.lower()) is not None


def volatile_columns(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> set[tuple[str, str]]:
    """(table, column) whose values differ between two executions' diffs of the same chain."""
    out: set[tuple[str, str]] = set()
    for table in set(a) | set(b):
        da, db = a.get(table, {}), b.get(table, {})
        rows_a = da.get("added", []) + [new for _, _, new in da.get("changed", [])]
        rows_b = db.get("added", []) + [new for _, _, new in db.get("changed", [])]
        if len(rows_a) != len(rows_b):
            continue
        for ra, rb in zip(rows_a, rows_b, strict=True):
            out |= {(table, c) for c in set(ra) | set(rb) if ra.get(c) != rb.get(c)}
    return out


def _stable(table: str, row: dict[str, Any], volatile: set[tuple[str, str]], given: set[str], *,
            keep_id: bool) -> dict[str, Any]:
    return {c: v for c, v in row.items()
            if (table, c) not in volatile and not _VOLATILE_NAME.search(c) and (keep_id or c != "id")
            and (v is None or isinstance(v, (str, int, float, bool))) and not _clock_value(v, given)}


def expected_state(diff: dict[str, dict[str, Any]], volatile: set[tuple[str, str]],
                   given: set[str] = frozenset()) -> dict[str, Any]:
    """The verifier's EXPECTED of a writing chain: per table the rows to find, change or miss
    (``given``: the text of every argument the calls passed, which no clock made)."""
    tables: dict[str, Any] = {}
    for table, d in diff.items():
        spec: dict[str, Any] = {}
        added = [_stable(table, r, volatile, given, keep_id=False) for r in d["added"]]
        if added:
            spec["added"] = added
        # a row whose only change is volatile (a stamp) is still one the task may change
        changed = [(rowid, {c: v for c, v in _stable(table, new, volatile, given, keep_id=True).items()
                            if old.get(c) != v}) for rowid, old, new in d["changed"]]
        if changed:
            spec["changed"] = changed
        if d["deleted"]:
            spec["deleted"] = list(d["deleted"])
        if spec:
            tables[table] = spec
    return {"tables": tables}


def key_value(result: Any, *, named: bool = False) -> tuple[str, Any] | None:
    """(field, value) a read-only chain's answer must state: a name-like text field first (the
    first item's, for lists), then a number that is not an id; None when the answer has neither.
    ``named``: the user names this record (a lookup by id: they call it by its name), so its
    name is no question: another field is asked."""
    best: list[tuple[int, str, Any]] = []
    for f in value_fields(result):
        values = field_values(result, f.path)
        if not values or isinstance(values[0], (dict, list, bool)):
            continue
        leaf = f.path.rsplit(".", 1)[-1].strip("[]")
        value = values[0]
        if leaf == "id" or leaf.endswith("_id"):
            continue
        if isinstance(value, str) and len(value.strip()) >= 2:
            rank = 0 if leaf in ("name", "title", "full_name", "display_name") else 1
            if rank == 0 and named:
                continue
        elif isinstance(value, (int, float)) and abs(value) >= 2:
            rank = 2  # 0 and 1 (counts, flags) are what a guess says
        else:
            continue
        best.append((rank, f.path, value))
    if not best:
        return None
    _, path, value = min(best, key=lambda t: t[0])
    return path, value


def read_only_expected(answer: Any, others: list[Any], right: str, *, limit: int = 200) -> dict[str, Any]:
    """The EXPECTED of a read-only chain: the value to state, and up to ``limit`` other
    candidates (no answer may state them too) that ``right``, the reference answer, does not
    state."""
    kept: list[Any] = []
    for value in others:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value).strip() \
                and not _same(value, answer) and not states(right, value) and not any(_same(value, k) for k in kept):
            kept.append(value)
    return {"tables": {}, "answer": answer, "others": kept[:limit]}


def verifier_code(expected: dict[str, Any], ignore: list[str] | None = None) -> str:
    """``verify_task_completion`` checking ``expected`` (see :func:`expected_state` and
    :func:`read_only_expected`); ``ignore``: tables the env's reads write (left out)."""
    if ignore:
        expected = {**expected, "ignore": sorted(ignore)}
    return _TEMPLATE.format(expected=expected, reader=READER) + reader_source() + "\n\n" + inspect.getsource(states)


def checks_something(expected: dict[str, Any]) -> bool:
    """False when nothing stable is left to check (every changed column was volatile)."""
    if expected.get("answer") is not None:
        return True
    return any(spec.get("added") or any(want for _, want in spec.get("changed", [])) or spec.get("deleted")
               for spec in expected.get("tables", {}).values())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return str(a).strip().lower() == str(b).strip().lower()


def wrong_answers(answer: tuple[str, Any] | None, last_result: Any, db_values: list[Any],
                  stated: list[Any]) -> list[str]:
    """What a no-op agent might answer, none of which may pass the verifier: for a question, the
    asked field with other values (the last call's other items, then ``db_values``: a same-named
    column of the database); for a change, "done" with every value the request states."""
    if answer is None:
        said = ", ".join(str(v) for v in stated if v is not None and str(v).strip())
        return ["Done, I've taken care of that.", f"Done: {said}." if said else "All set, it's updated."]
    path, value = answer
    leaf = path.rsplit(".", 1)[-1].strip("[]").replace("_", " ")
    others: list[Any] = []
    for v in [*field_values(last_result, path), *db_values]:
        if isinstance(v, (str, int, float)) and not isinstance(v, bool) and not _same(v, value) and \
                not any(_same(v, o) for o in others):
            others.append(v)
    if not others:
        return [f"I checked: there is no {leaf} to report."]
    return [f"The {leaf} is {v}." for v in others[:2]]
