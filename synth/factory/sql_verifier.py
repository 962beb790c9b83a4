"""AWM sql-mode verifiers (facts for the LLM judge) templated from an executed chain's end state.

The code-mode verifier of ``synth.factory.verifier`` decides alone; the paper's judge instead
reads facts a ``verify_task(initial_db_path, final_db_path) -> dict`` collects and decides with
the trajectory and the task's success / failure criteria. This template checks the same
``EXPECTED`` state (rows added, changed, deleted) and reports each check, decided or not, as a
fact: ``{"checks": [{"check": "...", "passed": bool}, ...], "passed": n, "failed": n}``. The answer
of a read-only chain is not a database fact: ``expected_answer`` hands it to the judge to compare
with the trajectory's final answer. The code runs only in the judge's sandbox.
"""

from __future__ import annotations

import json
from typing import Any

_SQL_TEMPLATE = '''def verify_task(initial_db_path: str, final_db_path: str) -> dict:
    import sqlite3

    EXPECTED = {expected!r}

    def table(path, name):
        try:
            conn = sqlite3.connect(f"file:{{path}}?mode=ro", uri=True)
            cur = conn.execute(f'SELECT rowid AS "__rowid", * FROM "{{name}}"')
            cols = [d[0] for d in cur.description]
            found = [dict(zip(cols, r)) for r in cur.fetchall()]
            conn.close()
            return found
        except Exception:
            return []

    def like(row, want):
        return all(row.get(k) == v for k, v in want.items())

    checks = []
    for name, spec in EXPECTED.get("tables", {{}}).items():
        before, after = table(initial_db_path, name), table(final_db_path, name)
        by_rowid = {{r["__rowid"]: r for r in after}}
        for want in spec.get("added", []):
            grew = sum(like(r, want) for r in after) > sum(like(r, want) for r in before)
            checks.append({{"check": f"a new {{name}} row with {{want}}", "passed": grew}})
        for rowid, want in spec.get("changed", []):
            ok = rowid in by_rowid and like(by_rowid[rowid], want)
            checks.append({{"check": f"{{name}} row {{rowid}} now has {{want}}", "passed": ok}})
        for rowid in spec.get("deleted", []):
            checks.append({{"check": f"{{name}} row {{rowid}} is deleted", "passed": rowid not in by_rowid}})
    facts = {{"checks": checks, "passed": sum(c["passed"] for c in checks),
              "failed": sum(not c["passed"] for c in checks)}}
    if EXPECTED.get("answer") is not None:
        facts["expected_answer"] = EXPECTED["answer"]
    return facts
'''

CRITERIA = {
    "reasoning": "Templated from the end state of the task's reference episode (EnvFactory chain).",
    "success_criteria": "Every check in the verifier's result passed (failed is 0), and where an "
                        "expected_answer is given the final answer states it.",
    "failure_criteria": "Any check failed, or the final answer does not state the expected_answer.",
}


def sql_verifier_code(expected: dict[str, Any]) -> str:
    """``verify_task`` reporting each check of ``expected`` (``synth.factory.verifier.expected_state``)."""
    return _SQL_TEMPLATE.format(expected=expected)


def sql_raw_response() -> str:
    """The verifier record's ``raw_response``: the criteria the judge decides by."""
    return json.dumps(CRITERIA)
