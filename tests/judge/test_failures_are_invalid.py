"""Failures are never scored as a valid 0.0: a code verifier that does not answer
complete/others, and an episode whose tool results carry an env error in any of the shapes the
farm sends (call answer without a kind, error body, MCP isError, MCP plain text)."""

from __future__ import annotations

import json

import pytest

from envfarm.verdict import Outcome, code_result_outcome
from judge import Judge, JudgeConfig, check_format
from judge.trajectory import Message, tool_result

VERIFIER = """
def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    return {"result": RESULT}
"""


@pytest.fixture
async def judge(sandbox):
    async with Judge(JudgeConfig(use_llm="never"), sandbox=sandbox) as j:
        yield j


@pytest.mark.parametrize(("value", "outcome"), [
    ("complete", Outcome.completed),
    (" Complete ", Outcome.completed),
    ("others", Outcome.agent_error),
    (None, Outcome.invalid),
    ("error", Outcome.invalid),
    ("verifier_failed: KeyError 'x'", Outcome.invalid),
    ("completed", Outcome.invalid),  # one rule: AWM's "complete" and nothing else
    ("success", Outcome.invalid),
    (1, Outcome.invalid),
    ([], Outcome.invalid),
])
async def test_code_verifier_results(judge, small_dbs, value, outcome):
    verdict = await judge.verify(VERIFIER.replace("RESULT", repr(value)), *small_dbs)
    assert verdict.outcome is outcome and code_result_outcome(value) is outcome
    if outcome is Outcome.invalid:
        assert verdict.reward is None and not verdict.valid
        assert verdict.error_kind == "verifier_error"


async def test_a_verifier_without_a_result_is_invalid(judge, small_dbs):
    code = VERIFIER.replace('{"result": RESULT}', '{"status": "done"}')
    verdict = await judge.verify(code, *small_dbs)
    assert verdict.outcome is Outcome.invalid and verdict.reward is None


MCP_ENV = {"content": [{"type": "text", "text": "env_error: the env crashed"}], "isError": True}
MCP_AGENT = {"content": [{"type": "text", "text": "agent_error: no tool nope"}], "isError": True}
MCP_BARE = {"content": [{"type": "text", "text": "something broke"}], "isError": True}


@pytest.mark.parametrize(("content", "ok", "kind"), [
    ({"ok": True, "result": {"x": 1}}, True, None),
    ({"ok": False, "error": {"kind": "agent_error", "message": "bad id"}}, False, "agent_error"),
    ({"ok": False, "error": {"kind": "env_error", "message": "boom"}}, False, "env_error"),
    ({"ok": False, "error": {"message": "no kind"}}, False, "env_error"),
    ({"ok": False}, False, "env_error"),
    ({"error": {"kind": "gone", "message": "lease closed"}}, False, "env_error"),
    ({"error": {"kind": "agent_error", "message": "bad"}}, False, "agent_error"),
    (MCP_ENV, False, "env_error"),
    (MCP_AGENT, False, "agent_error"),
    (MCP_BARE, False, "env_error"),
    ("env_error: Internal Server Error", False, "env_error"),
    ("agent_error: unknown tool", False, "agent_error"),
    ("plain text result", True, None),
    ({"error": "not found", "items": []}, True, None),  # an env's own result, not ours
])
def test_tool_results_are_read_in_every_shape(content, ok, kind):
    text = content if isinstance(content, str) else json.dumps(content)
    got_ok, got_kind, _ = tool_result(Message(role="tool", content=text))
    assert (got_ok, got_kind) == (ok, kind)


@pytest.mark.parametrize("failure", [
    {"ok": False, "error": {"message": "no kind"}},
    MCP_ENV,
    MCP_BARE,
    "env_error: Internal Server Error",
])
async def test_judge_gives_environment_error_not_zero(judge, traj, awm_cases, failure):
    case = awm_cases[0]
    t = (traj(case.task).list_tools()
         .use("search_products", {"query": "headphones"}, [{"offer_id": 1}]))
    t.call("call_tool", {"tool_name": "add_item_to_cart",
                         "arguments": json.dumps({"product_offer_id": 1, "quantity": 1})})
    t.tool(failure)
    trajectory = t.final().build()
    assert check_format(trajectory).environment_error
    # Even with the task's rows in place, the episode is not the agent's to be scored on.
    verdict = await judge.verify(case.code, case.initial, case.solved, trajectory=trajectory)
    assert verdict.outcome is Outcome.environment_error
    assert verdict.reward is None and not verdict.valid
