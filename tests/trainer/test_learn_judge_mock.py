"""The mock judge of ``benchmarks/trainer/learn_judge.py`` (``tests.fakes.faithful_judge``) applies the sql-mode tasks' criteria
to the facts the judge is shown. Its first version read "passed" as a count that must be
non-zero, so every read-only task (no checks: nothing may change) was an "Agent Error" whatever
the answer, and the judge-path learning runs could only succeed on write tasks."""

from __future__ import annotations

import json

import pytest

from envfarm.models import Criteria
from judge.llm_judge import build_messages
from judge.sandbox import VerifierResult
from synth.factory.sql_verifier import CRITERIA
from tests.fakes.faithful_judge import verdict_of
from tests.fakes.mock_openai import SeenRequest


def _verdict(facts: dict, final_answer: str | None) -> str:
    messages = build_messages("the task", VerifierResult(ok=True, mode="sql", result=facts),
                              Criteria(**CRITERIA), None, final_answer)
    req = SeenRequest(path="/v1/chat/completions", body={"messages": messages}, headers={},
                      received_at=0.0)
    return json.loads(verdict_of(req))["classification"]


READ_ONLY = {"checks": [], "passed": 0, "failed": 0, "expected_answer": "Blue Lagoon",
             "other_candidates": ["Red Dune", 42]}
WRITE = {"checks": [{"check": "a new wishlists row", "passed": True}], "passed": 1, "failed": 0}


@pytest.mark.parametrize("facts,answer,label", [
    (READ_ONLY, "The hotel is Blue Lagoon.", "Completed"),
    (READ_ONLY, "blue lagoon", "Completed"),
    (READ_ONLY, "Blue Lagoonish", "Agent Error"),  # whole words, as the code verifier reads it
    (READ_ONLY, "Blue Lagoon or Red Dune", "Agent Error"),  # a value dump
    (READ_ONLY, "Blue Lagoon, 42 stars", "Agent Error"),
    (READ_ONLY, None, "Agent Error"),
    (WRITE, "done", "Completed"),
    ({**WRITE, "checks": [*WRITE["checks"], {"check": "x", "passed": False}], "failed": 1},
     "done", "Agent Error"),
    ({"checks": [], "passed": 0, "failed": 0}, "done", "Agent Error"),  # nothing to judge by
])
def test_the_mock_judge_applies_the_tasks_criteria(facts, answer, label):
    assert _verdict(facts, answer) == label
