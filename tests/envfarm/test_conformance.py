"""The acceptance gate and the judge read a verifier's answer with one rule
(``envfarm.verdict.code_result_outcome``): a task is solvable exactly when the judge would
score its reference solution 1.0 and a no-op not."""

from __future__ import annotations

import pytest

from envfarm.check import check_solution
from envfarm.models import ToolCall
from envfarm.verdict import Outcome, code_result_outcome
from judge import VerifierSandbox

# Says WORD when the episode added a note, "others" when it did not.
VERIFIER = """
import sqlite3
def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    count = lambda p: sqlite3.connect(p).execute("SELECT COUNT(*) FROM notes").fetchone()[0]
    added = count(final_db_path) > count(initial_db_path)
    return {"result": WORD if added else "others"}
"""


@pytest.fixture(scope="module")
def sandbox():
    with VerifierSandbox(workers=2, timeout_s=10.0) as sb:
        yield sb


@pytest.mark.parametrize("word", ["complete", " COMPLETE", "completed", "success", "done"])
async def test_gate_and_judge_agree(toy_runtime, sandbox, word):
    calls = [ToolCall(tool="create_note", arguments={"title": "gate"})]
    check = await check_solution(toy_runtime, VERIFIER.replace("WORD", repr(word)), calls,
                                 sandbox)
    assert check.evaluated and check.solution_result == word
    assert check.solvable is (code_result_outcome(word) is Outcome.completed)
    assert check.solvable is (word.strip().lower() == "complete")
