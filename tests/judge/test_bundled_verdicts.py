"""Verdicts and rewards on every bundled task: reference solution -> Completed 1.0, no-op -> not."""

from __future__ import annotations

import pytest

from envfarm import EnvRuntime
from judge import Judge, JudgeConfig, JudgeRequest, Outcome, VerifierCode

BUNDLED = ["hotel_booking_1", "personal_banking_1", "project_management_1"]


@pytest.mark.parametrize("name", BUNDLED)
async def test_reference_solutions_complete_and_noops_do_not(bundled_catalog, name):
    bundle = bundled_catalog[name]
    runtime = EnvRuntime(bundle)
    requests, expected = [], []
    for idx in range(len(bundle.tasks)):
        inst = runtime.instance()
        for call in bundle.solutions[idx]:
            assert (await inst.call(call.tool, call.arguments)).ok
        verifier = VerifierCode(code=bundle.code_verifiers[idx].code)
        for final, outcome in ((inst.snapshot(), Outcome.completed),
                               (runtime.template.data, Outcome.agent_error)):
            requests.append(JudgeRequest(task=bundle.tasks[idx], verifier=verifier, task_idx=idx,
                                         initial_db_b64=runtime.template.data, final_db_b64=final))
            expected.append(outcome)
        inst.close()
    async with Judge(JudgeConfig(use_llm="never")) as judge:
        verdicts = await judge.judge_many(requests)
    for request, verdict, outcome in zip(requests, verdicts, expected):
        assert verdict.outcome is outcome, (request.task_idx, verdict)
        assert verdict.valid and verdict.reward == (1.0 if outcome is Outcome.completed else 0.0)
