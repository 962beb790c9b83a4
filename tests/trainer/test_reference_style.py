"""The reference turns a tiny model imitates: the request's step restated, arguments as an object."""

from __future__ import annotations

import asyncio
import json

from envfarm.models import ToolCall
from trainer.episode import EndReason, run_episode
from trainer.format import TurnKind, parse_assistant
from trainer.policy import ScriptedPolicy, TurnContext, request_step

from .conftest import leased

REQUEST = ('Step 1: Show budget categories. Step 2: Create a monthly budget with {"category_id": 4, '
           '"month": "2025-06"}. Step 10: Done with {"x": 1}.')


def test_request_step_finds_each_numbered_sentence() -> None:
    assert request_step(REQUEST, 1) == "Step 1: Show budget categories."
    assert request_step(REQUEST, 2) == ('Step 2: Create a monthly budget with {"category_id": 4, '
                                        '"month": "2025-06"}.')
    assert request_step(REQUEST, 10) == 'Step 10: Done with {"x": 1}.'  # not cut at "Step 1"
    assert request_step(REQUEST, 3) is None
    assert request_step("Book a room, then pay.", 1) is None


def test_restated_turn_carries_the_step_and_an_object_call() -> None:
    call = ToolCall(tool="create_budget", arguments={"category_id": 4, "month": "2025-06"})
    policy = ScriptedPolicy({("env", 0): [ToolCall(tool="list_budget_categories"), call]},
                            brief=True, restate=True, object_arguments=True)
    text = policy.turn_text(TurnContext(env="env", task_idx=0, task=REQUEST, turn=2))
    # the call's arguments are the very characters the request wrote
    assert request_step(REQUEST, 2) in text and '"arguments": {"category_id": 4, "month": "2025-06"}}' in text
    turn = parse_assistant(text)
    assert turn.kind is TurnKind.call and turn.call.arguments == {
        "tool_name": "create_budget", "arguments": {"category_id": 4, "month": "2025-06"}}
    plain = ScriptedPolicy({("env", 0): [call]}, brief=True)  # default: a JSON string, "Step 1."
    text = plain.turn_text(TurnContext(env="env", task_idx=0, task=REQUEST, turn=1))
    assert "Step 1.\n" in text and json.loads(parse_assistant(text).call.arguments["arguments"]) == call.arguments
    # a request without numbered steps keeps the brief reasoning
    fallback = ScriptedPolicy({("env", 0): [call]}, brief=True, restate=True)
    assert "Step 1.\n" in fallback.turn_text(TurnContext(env="env", task_idx=0, task="Pay.", turn=1))


async def test_object_arguments_solve_every_bundled_task(farm, farm_core, bundled_catalog) -> None:
    """The farm's loop and format rules take call_tool arguments as an object: same rewards."""
    policy = ScriptedPolicy.from_catalog(bundled_catalog, brief=True, restate=True, object_arguments=True)
    jobs = [(env, idx) for env in bundled_catalog.servable for idx in sorted(bundled_catalog[env].solutions)]
    results = await asyncio.gather(*(run_episode(farm, policy, env, idx) for env, idx in jobs))
    assert [(r.env, r.task_idx, r.reason) for r in results if not r.success] == []
    assert all(r.end is EndReason.final_answer for r in results)
    sent = results[0].turns[2].generation.text
    assert '"arguments": {' in sent and '"arguments": "{' not in sent
    assert leased(farm_core) == 0
