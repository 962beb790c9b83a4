"""The code-augmented LLM judge against a real local OpenAI-compatible server (the mock)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator

import pytest

from envfarm.llm import LLMClient, LLMConfig
from judge import (
    AnswerParseError,
    Judge,
    JudgeConfig,
    JudgeRequest,
    Outcome,
    VerifierCode,
    parse_llm_verdict,
)
from tests.fakes.mock_openai import MockOpenAI, Reply


def answer(classification: str, confidence: float = 0.9, **extra) -> str:
    return json.dumps({"classification": classification, "reasoning": f"looks {classification}",
                       "confidence": confidence, "evidence": ["correct_offer_in_final_cart"],
                       **extra})


@pytest.fixture
def mock() -> MockOpenAI:
    with MockOpenAI() as server:
        yield server


@pytest.fixture
async def llm_judge(mock, sandbox) -> AsyncIterator[Judge]:
    client = LLMClient(LLMConfig(base_url=mock.url, model="judge-mock", max_retries=3,
                                 backoff_base_s=0.01, backoff_max_s=0.05, max_concurrency=64,
                                 timeout_s=10))
    judge = Judge(JudgeConfig(use_llm="always"), llm_client=client, sandbox=sandbox)
    yield judge
    await judge.aclose()


@pytest.fixture
async def code_judge(sandbox) -> AsyncIterator[Judge]:
    judge = Judge(JudgeConfig(), sandbox=sandbox)
    yield judge
    await judge.aclose()


async def sql_case_verdict(judge: Judge, case, final: bytes, trajectory=None):
    return await judge.verify(case.sql["code"], case.initial, final, task=case.task,
                              raw_response=case.sql["raw_response"], trajectory=trajectory)


def prompt_blocks(prompt: str) -> tuple[dict, dict]:
    """The two data blocks of a judge prompt, decoded."""
    task = re.search(r"<task_json>\n(.*)\n</task_json>", prompt, re.DOTALL)
    verification = re.search(r"<verification_json>\n(.*)\n</verification_json>", prompt,
                             re.DOTALL)
    return json.loads(task.group(1)), json.loads(verification.group(1))


# -- classification end to end --------------------------------------------------------------

async def test_reference_solution_is_completed(llm_judge, mock, awm_cases, good_traj):
    case = awm_cases[0]
    mock.script(answer("Completed"))
    verdict = await sql_case_verdict(llm_judge, case, case.solved, good_traj.build())
    assert (verdict.outcome, verdict.reward, verdict.valid) == (Outcome.completed, 1.0, True)
    assert verdict.confidence == 0.9
    assert verdict.details["evidence"] == ["correct_offer_in_final_cart"]
    # what the judge saw: the task, the trajectory, the verifier's facts and the criteria
    (req,) = mock.requests_for(stage="judge")
    prompt = req.last_user
    task_json, verification_json = prompt_blocks(prompt)
    assert task_json["user_task"] == case.task
    calls = [s for s in task_json["trajectory"] if s.get("tool_call") == "call_tool"]
    assert calls[-1]["arguments"]["tool_name"] == "add_item_to_cart"
    assert task_json["actual_execution_steps"] == 4
    summary = verification_json["code_execution_result"]["judgment_summary"]
    assert summary["correct_offer_in_final_cart"] is True
    criteria = json.loads(case.sql["raw_response"])
    assert verification_json["success_criteria"] == criteria["success_criteria"]
    assert verification_json["failure_criteria"] == criteria["failure_criteria"]
    assert verification_json["code"] == case.sql["code"]  # the paper's judge reads the code
    assert "shortened" not in prompt  # all of it fit
    assert req.body["temperature"] == 0.0


async def test_noop_is_not_completed(llm_judge, mock, awm_cases):
    case = awm_cases[0]
    # the judge answers from what it sees: script by the verifier facts in the prompt
    mock.script(answer("Agent Error"), pattern=r'"correct_offer_in_final_cart":false')
    mock.script(answer("Completed"), pattern=r'"correct_offer_in_final_cart":true')
    noop = await sql_case_verdict(llm_judge, case, case.initial)
    done = await sql_case_verdict(llm_judge, case, case.solved)
    assert (noop.outcome, noop.reward) == (Outcome.agent_error, 0.0)
    assert (done.outcome, done.reward) == (Outcome.completed, 1.0)


@pytest.mark.parametrize(
    ("said", "outcome", "reward"),
    [("Partially Completed", Outcome.partially_completed, 0.1),
     ("partially_completed", Outcome.partially_completed, 0.1),
     ("AGENT ERROR", Outcome.agent_error, 0.0),
     ("Environment Error", Outcome.environment_error, None)],
)
async def test_classes_map_to_rewards(llm_judge, mock, awm_cases, said, outcome, reward):
    mock.script(answer(said))
    verdict = await sql_case_verdict(llm_judge, awm_cases[1], awm_cases[1].solved)
    assert (verdict.outcome, verdict.reward) == (outcome, reward)
    assert verdict.valid is (reward is not None)


# -- transient errors and parsing -----------------------------------------------------------

async def test_retries_429_and_500(llm_judge, mock, awm_cases):
    mock.script(Reply.error(429), Reply.error(500), answer("Completed"))
    verdict = await sql_case_verdict(llm_judge, awm_cases[0], awm_cases[0].solved)
    assert verdict.outcome is Outcome.completed
    assert len(mock.requests_for(stage="judge")) == 3


async def test_endpoint_that_keeps_failing_is_a_judge_error(llm_judge, mock, awm_cases):
    mock.script(Reply.error(503), repeat=True)
    verdict = await sql_case_verdict(llm_judge, awm_cases[0], awm_cases[0].solved)
    assert verdict.outcome is Outcome.invalid and verdict.error_kind == "judge_error"
    assert verdict.reward is None and not verdict.valid
    assert len(mock.requests_for(stage="judge")) == 4  # 1 + max_retries


async def test_malformed_answer_is_repaired(llm_judge, mock, awm_cases):
    mock.script('{"classification": "Completed", "reasoning": "ok", confidence: }',
                "```json\n" + answer("Completed", 0.7) + "\n```")
    verdict = await sql_case_verdict(llm_judge, awm_cases[0], awm_cases[0].solved)
    assert verdict.outcome is Outcome.completed and verdict.details["repairs"] == 1
    repair = mock.requests_for(stage="judge")[1]
    assert "could not be used" in repair.last_user and "invalid JSON" in repair.last_user
    assert repair.messages[-2]["role"] == "assistant"


async def test_unparseable_twice_is_a_judge_error(llm_judge, mock, awm_cases):
    mock.script("I think the agent did great!", answer("Excellent"))
    verdict = await sql_case_verdict(llm_judge, awm_cases[0], awm_cases[0].solved)
    assert verdict.outcome is Outcome.invalid and verdict.error_kind == "judge_error"
    assert verdict.reward is None
    assert "classification" in verdict.reason


def test_parse_answer_is_strict():
    assert parse_llm_verdict(answer("Completed")).classification == "Completed"
    for bad in ["", "[1]", '{"classification": "Completed"}',
                answer("Completed", confidence=1.5), answer("Maybe")]:
        with pytest.raises(AnswerParseError):
            parse_llm_verdict(bad)


# -- what never reaches the LLM -------------------------------------------------------------

async def test_format_error_short_circuits(llm_judge, mock, awm_cases, traj):
    bad = traj(awm_cases[0].task).list_tools().say("no think, no call").build()
    verdict = await sql_case_verdict(llm_judge, awm_cases[0], awm_cases[0].solved, bad)
    assert (verdict.outcome, verdict.reward) == (Outcome.format_error, -1.0)
    assert mock.requests == []


async def test_broken_verifier_is_invalid_not_zero(llm_judge, mock, awm_cases):
    case = awm_cases[2]  # the dataset's sql verifier with a syntax error
    verdict = await sql_case_verdict(llm_judge, case, case.solved)
    assert verdict.outcome is Outcome.invalid and verdict.error_kind == "verifier_error"
    assert verdict.reward is None and "syntax error" in verdict.reason
    assert mock.requests == []


# -- code-only mode (no endpoint configured) ------------------------------------------------

@pytest.mark.parametrize("idx", [1, 2])
async def test_code_only_mode(code_judge, awm_cases, idx):
    case = awm_cases[idx]
    assert code_judge.mode == "code"
    solved = await code_judge.verify(case.code["code"], case.initial, case.solved)
    noop = await code_judge.verify(case.code["code"], case.initial, case.initial)
    assert (solved.outcome, solved.reward) == (Outcome.completed, 1.0)
    assert (noop.outcome, noop.reward) == (Outcome.agent_error, 0.0)


async def test_code_only_mode_cannot_judge_sql_output(code_judge, awm_cases):
    case = awm_cases[0]
    verdict = await code_judge.verify(case.sql["code"], case.initial, case.solved)
    assert verdict.outcome is Outcome.invalid and verdict.reward is None


def test_from_env_without_endpoint_is_code_only(monkeypatch):
    monkeypatch.delenv("ENVFARM_LLM_BASE_URL", raising=False)
    judge = Judge.from_env()
    try:
        assert judge.mode == "code"
    finally:
        judge.close()


# -- many at once ---------------------------------------------------------------------------

async def test_many_judgments_overlap(mock, llm_judge, awm_cases):
    mock.latency_s = 0.2
    mock.script(answer("Completed"), repeat=True)
    case = awm_cases[0]
    requests = [JudgeRequest(id=str(i), task=case.task,
                             verifier=VerifierCode(code=case.sql["code"],
                                                   raw_response=case.sql["raw_response"]),
                             initial_db_b64=case.initial, final_db_b64=case.solved)
                for i in range(40)]
    t0 = time.perf_counter()
    verdicts = await llm_judge.judge_many(requests)
    wall = time.perf_counter() - t0
    assert [v.outcome for v in verdicts] == [Outcome.completed] * 40
    assert wall < 40 * 0.2 / 4  # far from sequential
    assert mock.max_in_flight > 1


def test_request_carries_databases_as_base64(awm_cases):
    case = awm_cases[0]
    req = JudgeRequest(task="t", initial_db_b64=case.initial, final_db="/x.db")
    wire = json.loads(req.model_dump_json())
    assert isinstance(wire["initial_db_b64"], str)
    back = JudgeRequest.model_validate(wire)
    assert back.initial_db_b64 == case.initial
    assert back.databases() == (case.initial, "/x.db")


def test_request_databases_travel_compressed_and_raw_is_read_too(awm_cases, monkeypatch):
    import base64
    import zlib

    from pydantic import ValidationError

    import judge.core

    monkeypatch.setattr(judge.core, "MAX_DB_BYTES", 1 << 20)  # a small cap: a cheap bomb

    case = awm_cases[0]
    wire = json.loads(JudgeRequest(task="t", initial_db_b64=case.initial).model_dump_json())
    assert len(wire["initial_db_b64"]) < len(case.initial) / 4  # zlib: ~10x on SQLite pages
    raw = {"task": "t", "initial_db_b64": base64.b64encode(case.initial).decode()}
    assert JudgeRequest.model_validate(raw).initial_db_b64 == case.initial  # older clients
    bomb = base64.b64encode(zlib.compress(b"\0" * (3 << 20), 9)).decode()  # 3 MiB inflated
    with pytest.raises(ValidationError, match="MiB"):
        JudgeRequest.model_validate({"task": "t", "final_db_b64": bomb})
    broken = base64.b64encode(b"\x78\x9cnot zlib at all").decode()
    with pytest.raises(ValidationError, match="zlib"):
        JudgeRequest.model_validate({"task": "t", "final_db_b64": broken})
