"""The history window: same truncation at rollout and training; one sample per turn."""

from __future__ import annotations

from judge import Message
from trainer.episode import run_episode
from trainer.format import call_tool_text, final_text, render, tool_call_text
from trainer.window import head_length, samples, window

from .test_episode import Lines

ENV = "hotel_booking_1"


def _roles(msgs):
    return [m.role for m in msgs]


async def test_six_turn_episode_samples_are_what_the_policy_saw(farm):
    turns = [tool_call_text("list_tools", {}, "list"),
             call_tool_text("search_hotels", {"city": "Lisbon"}, "think-one"),
             call_tool_text("list_payment_methods", {}, "think-two"),
             call_tool_text("get_reservation", {"reservation_id": 424242}, "three"),
             call_tool_text("search_hotels", {"city": "Porto"}, "four"),
             final_text("done", "five")]
    policy = Lines(*turns)
    result = await run_episode(farm, policy, ENV, 0)
    msgs = result.trajectory.messages
    assert _roles(msgs) == ["system", "user"] + ["assistant", "tool"] * 5 + ["assistant"]
    split = samples(msgs, w=3)
    assert len(split) == 6 == len(policy.seen)
    for k, sample in enumerate(split):
        assert sample.prompt == policy.seen[k] == result.turns[k].prompt, k
        assert sample.completion.content == turns[k]
        assert render(sample.prompt) == render(policy.seen[k])
    # turn 5 saw: system, task, the list_tools exchange, and turns 2..4 (not turn 1)
    last = split[5].prompt
    assert last[:4] == msgs[:4]
    assert last[4:] == msgs[6:12]
    assert "think-one" not in render(last) and "think-two" in render(last)
    # up to turn 4 nothing was cut: head (4) + 3 turns of 2 messages
    assert split[4].prompt == msgs[:10]


def test_window_keeps_head_and_last_w_turns():
    sys_, task = Message(role="system", content="s"), Message(role="user", content="t")
    lt = Message(role="assistant", content=tool_call_text("list_tools", {}, "l"))
    tool = Message(role="tool", content="{}")
    calls = [Message(role="assistant", content=f"<think>{i}</think>") for i in range(5)]
    msgs = [sys_, task, lt, tool] + [m for c in calls for m in (c, tool)]
    assert head_length(msgs) == 4
    assert window(msgs, 2) == msgs[:4] + msgs[-4:]
    assert window(msgs, 0) == msgs[:4]
    assert window(msgs, None) == msgs
    # no list_tools first: the head is system + task only
    plain = [sys_, task] + calls
    assert window(plain, 1) == [sys_, task, calls[-1]]
