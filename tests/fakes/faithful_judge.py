"""A faithful mock judge model: what a judge that follows the sql-mode tasks' criteria answers.

No LLM runs in tests or in ``benchmarks/trainer/learn_judge.py``; this answers the judge's chat
(served by ``tests.fakes.mock_openai.MockOpenAI``) from the facts it is shown.
"""

from __future__ import annotations

import json

from synth.factory.verifier import states
from tests.fakes.mock_openai import SeenRequest


def verdict_of(req: SeenRequest) -> str:
    """The faithful mock judge, the task's criteria (``synth.factory.sql_verifier.CRITERIA``)
    applied to the sql-mode verifier's facts: Completed when no check failed, and where an
    expected answer is given, the final answer states it (``states``: the code-mode verifier's
    rule) and none of the other candidates. A read-only chain has no checks at all (nothing may
    change, nothing did): its answer decides."""
    text = req.last_user
    task = json.loads(text.split("<task_json>\n", 1)[1].split("\n</task_json>", 1)[0])
    block = text.split("<verification_json>\n", 1)[1].split("\n</verification_json>", 1)[0]
    facts = json.loads(block).get("code_execution_result") or {}
    done = facts.get("failed") == 0 and (bool(facts.get("passed")) or "expected_answer" in facts)
    if "expected_answer" in facts:
        answer = str(task.get("final_answer") or "")
        done = (done and states(answer, facts["expected_answer"])
                and not any(states(answer, o) for o in facts.get("other_candidates") or []))
    label = "Completed" if done else "Agent Error"
    return json.dumps({"reasoning": f"{facts.get('passed')} checks passed, {facts.get('failed')} failed",
                       "classification": label, "confidence": 0.9, "evidence": {"checks": facts.get("checks")}})
