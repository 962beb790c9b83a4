"""Every path on which the judge cannot decide yields invalid (reward null), never 0.0.

Each case runs the real judge (sandbox, and a real HTTP endpoint where an LLM is involved); a
mutation that turned any of them into a 0.0 makes this file fail.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from envfarm.llm import LLMClient, LLMConfig
from envfarm.verdict import EpisodeContext
from judge import (
    Judge,
    JudgeConfig,
    JudgeRequest,
    Outcome,
    VerifierCode,
    VerifierSandbox,
)
from tests.fakes.mock_openai import MockOpenAI, Reply

CODE = """
def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    return {"result": "others"}
"""
SQL = """
def verify_task(initial_db_path, final_db_path):
    return {"rows_after": 2}
"""


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def _client(base_url: str) -> LLMClient:
    return LLMClient(LLMConfig(base_url=base_url, model="judge", max_retries=1,
                               backoff_base_s=0.01, backoff_max_s=0.02, timeout_s=5))


Case = Callable[[Judge, Judge, tuple[Path, Path], MockOpenAI], Awaitable]


async def missing_verifier(code_j, llm_j, dbs, mock):
    return await code_j.verify(None, *dbs)


async def missing_database(code_j, llm_j, dbs, mock):
    return await code_j.verify(CODE, dbs[0], None)


async def database_file_gone(code_j, llm_j, dbs, mock):
    return await code_j.verify(CODE, dbs[0], dbs[1].parent / "no_such.db")


async def database_not_sqlite(code_j, llm_j, dbs, mock):
    return await code_j.verify(CODE, dbs[0], b"this is not a database" * 100)


async def verifier_crashes(code_j, llm_j, dbs, mock):
    return await code_j.verify(CODE.replace('return {"result": "others"}', "1 / 0"), *dbs)


async def crash_inside_judge_many(code_j, llm_j, dbs, mock):
    broken = Judge(JudgeConfig(use_llm="never"), sandbox=VerifierSandbox(workers=1))
    broken.sandbox.close()  # a judge whose sandbox is gone: it raises, judge_many must not
    request = JudgeRequest(task="t", verifier=VerifierCode(code=CODE),
                           initial_db=str(dbs[0]), final_db=str(dbs[1]))
    (verdict,) = await broken.judge_many([request])
    return verdict


async def sql_output_without_llm(code_j, llm_j, dbs, mock):
    return await code_j.verify(SQL, *dbs)


async def endpoint_down(code_j, llm_j, dbs, mock):
    async with Judge(JudgeConfig(use_llm="always"),
                     llm_client=_client(f"http://127.0.0.1:{_dead_port()}/v1"),
                     sandbox=code_j.sandbox) as judge:
        return await judge.verify(SQL, *dbs, task="t")


async def endpoint_errors(code_j, llm_j, dbs, mock):
    mock.script(Reply.error(500), repeat=True)
    return await llm_j.verify(SQL, *dbs, task="t")


async def malformed_answer(code_j, llm_j, dbs, mock):
    mock.script("I think it is fine", '{"classification": "Success", "reasoning": "x"}')
    return await llm_j.verify(SQL, *dbs, task="t")


async def unreadable_trajectory(code_j, llm_j, dbs, mock):
    context = EpisodeContext(task="t", trajectory={"messages": "not a list"}, sql_code=SQL)
    return await llm_j.verify(CODE, *dbs, context=context)


CASES = [missing_verifier, missing_database, database_file_gone, database_not_sqlite,
         verifier_crashes, crash_inside_judge_many, sql_output_without_llm, endpoint_down,
         endpoint_errors, malformed_answer, unreadable_trajectory]


@pytest.fixture
def mock() -> MockOpenAI:
    with MockOpenAI() as server:
        yield server


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
async def test_undecidable_is_invalid_never_zero(case, sandbox, small_dbs, mock):
    async with Judge(JudgeConfig(use_llm="never"), sandbox=sandbox) as code_j, \
            Judge(JudgeConfig(use_llm="always"), llm_client=_client(mock.url),
                  sandbox=sandbox) as llm_j:
        verdict = await case(code_j, llm_j, small_dbs, mock)
    assert verdict.reward != 0.0
    assert (verdict.outcome, verdict.reward, verdict.valid) == (Outcome.invalid, None, False)
    assert verdict.error_kind in ("verifier_error", "judge_error")
    json.dumps(verdict.model_dump(mode="json"))  # and it travels


async def test_a_decidable_sql_episode_does_reach_the_llm(sandbox, small_dbs, mock):
    """The counterpart: the same setup with a good answer is judged (the cases above are not
    invalid merely because the setup is broken)."""
    mock.script(json.dumps({"classification": "Agent Error", "reasoning": "nothing done",
                            "confidence": 0.7}))
    async with Judge(JudgeConfig(use_llm="always"), llm_client=_client(mock.url),
                     sandbox=sandbox) as judge:
        verdict = await judge.verify(SQL, *small_dbs, task="t")
    assert (verdict.outcome, verdict.reward) == (Outcome.agent_error, 0.0)
