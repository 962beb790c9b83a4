"""The agent loop against a real in-process farm: success, every bad-input outcome, no leaks."""

from __future__ import annotations

import asyncio
import json

import pytest

from judge import Message
from trainer.episode import EndReason, EpisodeConfig, run_episode
from trainer.format import call_tool_text, final_text, tool_call_text
from trainer.policy import FINISH_LENGTH, Generation, ScriptedPolicy, TurnContext

from .conftest import leased

ENV = "hotel_booking_1"
LIST = tool_call_text("list_tools", {}, "I list the tools.")


class Lines:
    """A policy that says the given turns in order (the last one forever)."""

    def __init__(self, *texts: str, finish: str = "stop") -> None:
        self.texts = texts
        self.finish = finish
        self.seen: list[list[Message]] = []

    async def generate(self, messages, ctx: TurnContext) -> Generation:
        self.seen.append(list(messages))
        return Generation(text=self.texts[min(ctx.turn, len(self.texts) - 1)],
                          finish_reason=self.finish)


async def test_scripted_policy_solves_every_bundled_task(farm, farm_core, bundled_catalog):
    policy = ScriptedPolicy.from_catalog(bundled_catalog)
    jobs = [(env, idx) for env in bundled_catalog.servable
            for idx in sorted(bundled_catalog[env].solutions)]
    assert len(jobs) == 30
    results = await asyncio.gather(*(run_episode(farm, policy, env, idx) for env, idx in jobs))
    failed = [(r.env, r.task_idx, r.outcome, r.reason) for r in results if not r.success]
    assert failed == []
    assert all(r.end is EndReason.final_answer and r.valid for r in results)
    first = results[0]
    assert first.env_calls == len(bundled_catalog[ENV].solutions[0]) + 2  # list, calls, verify
    assert first.trajectory.tools and first.trajectory.final_answer == "The task is done."
    assert leased(farm_core) == 0


@pytest.mark.parametrize("texts, end, reward", [
    (["no tags at all, no call"], EndReason.format_error, -1.0),                # rule 1
    (["<think>x</think><tool_call>{not json</tool_call>"], EndReason.format_error, -1.0),
    ([LIST, call_tool_text("no_such_tool", {}, "try")], EndReason.format_error, -1.0),
    ([LIST, '<think>t</think><tool_call>{"name": "call_tool", "arguments": '
      '{"tool_name": "search_hotels", "arguments": "{oops"}}</tool_call>'],
     EndReason.format_error, -1.0),                                            # non-JSON args
    ([call_tool_text("search_hotels", {}, "skip listing")], EndReason.format_error, -1.0),
    ([LIST, LIST], EndReason.format_error, -1.0),                               # list twice
    (["<think>a</think><tool_call>{\"name\": \"list_tools\"}</tool_call>"
      "<tool_call>{\"name\": \"list_tools\"}</tool_call>"], EndReason.format_error, -1.0),
    # list_tools then a refusal: rule 5 (the paper penalizes refusals), not an agent error
    ([LIST, final_text("done", "I give up")], EndReason.final_answer, -1.0),
])
async def test_bad_turns_end_typed_and_release(farm, farm_core, texts, end, reward):
    result = await run_episode(farm, Lines(*texts), ENV, 0)
    assert (result.end, result.reward, result.valid) == (end, reward, True)
    assert leased(farm_core) == 0


async def test_never_stopping_policy_is_too_long(farm, farm_core):
    cut = await run_episode(farm, Lines("<think>" + "la " * 50, finish=FINISH_LENGTH), ENV, 0)
    huge = await run_episode(farm, Lines(LIST, "<think>" + "x" * 20_000 + "</think> done"), ENV, 0)
    assert (cut.end, cut.reward) == (EndReason.too_long, -1.0)
    assert (huge.end, huge.reward) == (EndReason.too_long, -1.0)
    assert leased(farm_core) == 0


async def test_turn_limit_and_agent_errors_keep_going(farm, farm_core):
    bad_id = call_tool_text("get_reservation", {"reservation_id": 424242}, "look it up")
    result = await run_episode(farm, Lines(LIST, bad_id), ENV, 0,
                               config=EpisodeConfig(max_turns=5))
    assert result.end is EndReason.turn_limit and len(result.turns) == 5
    answers = [json.loads(m.content) for m in result.trajectory.messages if m.role == "tool"]
    assert [a["ok"] for a in answers] == [True, False, False, False, False]
    assert answers[1]["error"]["kind"] == "agent_error"
    assert result.reward == -1.0  # rule 5: many turns, no successful call
    assert leased(farm_core) == 0


async def test_lease_gone_mid_episode_is_invalid(farm, farm_core):
    class Releaser(Lines):
        """Turn 1 happens after someone else released the lease: the farm answers 410."""

        lease_holder: list = []

        async def generate(self, messages, ctx):
            if ctx.turn == 1:
                await self.lease_holder[0].release()
            return await super().generate(messages, ctx)

    lease = await farm.acquire(ENV, task_idx=0)
    policy = Releaser(LIST, call_tool_text("search_hotels", {"city": "Lisbon"}, "search"))
    policy.lease_holder = [lease]
    result = await run_episode(farm, policy, ENV, 0, lease=lease)
    assert (result.end, result.valid, result.reward) == (EndReason.lease_lost, False, None)
    assert leased(farm_core) == 0


async def test_cancelled_episode_releases_its_lease(farm, farm_core):
    gate = asyncio.Event()

    class Stuck(Lines):
        async def generate(self, messages, ctx):
            gate.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(run_episode(farm, Stuck("x"), ENV, 0))
    await gate.wait()
    assert leased(farm_core) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)
    assert leased(farm_core) == 0
