"""AWM sql-mode verifiers (facts for the LLM judge) templated from an executed chain's end state.

The code-mode verifier of ``synth.factory.verifier`` decides alone; the paper's judge instead
reads facts a ``verify_task(initial_db_path, final_db_path) -> dict`` collects and decides with
the trajectory and the task's success / failure criteria. This template checks what the code-mode
one does, exactly both ways (each row the task adds, changes or deletes; every other row as it
was, tables the env's reads write left out), and reports each check as a fact:
``{"checks": [{"check": "...", "passed": bool}, ...], "passed": n, "failed": n}`` (a collateral
change is a failed check of its own). The answer of a read-only chain is not a database fact:
``expected_answer`` and ``other_candidates`` hand it to the judge, to compare with the
trajectory's final answer. The code runs only in the judge's sandbox.
"""

from __future__ import annotations

import json
from typing import Any

from synth.factory.verifier import READER, reader_source

_SQL_TEMPLATE = '''def verify_task(initial_db_path: str, final_db_path: str) -> dict:
    EXPECTED = {expected!r}
    checks = []

    def check(what, ok):
        checks.append({{"check": what, "passed": bool(ok)}})

    def matches(row, want):
        return all(row.get(k) == v for k, v in want.items())

    before, after = {reader}(initial_db_path), {reader}(final_db_path)
    for table in sorted(set(before) | set(after)):
        if table in EXPECTED.get("ignore", []):
            continue
        spec = EXPECTED.get("tables", {{}}).get(table, {{}})
        old, new = before.get(table, {{}}), after.get(table, {{}})
        added = [row for rowid, row in new.items() if rowid not in old]
        for want in spec.get("added", []):
            hit = next((row for row in added if matches(row, want)), None)
            check(f"a new {{table}} row with {{want}}", hit is not None)
            if hit is not None:
                added.remove(hit)
        if added:
            check(f"no other {{table}} rows added ({{len(added)}} were)", False)
        changed, deleted = dict(spec.get("changed", [])), set(spec.get("deleted", []))
        for rowid in sorted(deleted):
            check(f"{{table}} row {{rowid}} deleted", rowid not in new)
        for rowid, want in changed.items():
            check(f"{{table}} row {{rowid}} now has {{want}}", rowid in new and matches(new[rowid], want))
        other = [r for r, row in old.items() if r not in deleted and r not in changed and new.get(r) != row]
        if other:
            check(f"every other {{table}} row as it was ({{len(other)}} changed or deleted)", False)
    facts = {{"checks": checks, "passed": sum(c["passed"] for c in checks),
              "failed": sum(not c["passed"] for c in checks)}}
    if "answer" in EXPECTED:
        facts["expected_answer"] = EXPECTED["answer"]
        facts["other_candidates"] = EXPECTED.get("others", [])
    return facts


'''

CRITERIA = {
    "reasoning": "Templated from the end state of the task's reference episode (EnvFactory chain).",
    "success_criteria": "Every check in the verifier's result passed (failed is 0), and where an "
                        "expected_answer is given the final answer states it and none of the "
                        "other_candidates.",
    "failure_criteria": "Any check failed, or the final answer does not state the expected_answer, "
                        "or it also states one of the other_candidates.",
}


def sql_verifier_code(expected: dict[str, Any], ignore: list[str] | None = None) -> str:
    """``verify_task`` reporting each check of ``expected`` (``synth.factory.verifier``'s
    ``expected_state`` / ``read_only_expected``); ``ignore``: tables the env's reads write."""
    if ignore:
        expected = {**expected, "ignore": sorted(ignore)}
    return _SQL_TEMPLATE.format(expected=expected, reader=READER) + reader_source()


def sql_raw_response() -> str:
    """The verifier record's ``raw_response``: the criteria the judge decides by."""
    return json.dumps(CRITERIA)
