"""The history window, used identically at rollout time and at training time.

The model sees the system prompt, the task, the first ``list_tools`` exchange, and the last ``w``
turns (a turn = an assistant message and the tool answers that follow it). Training splits an
episode into one sample per assistant turn, each conditioned on exactly the window the policy
was shown when it wrote that turn: ``samples(messages, w)[k].prompt == window(messages[:i], w)``
where ``i`` is the index of the k-th assistant message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from judge import Message
from judge.trajectory import LIST_TOOLS, parse_turn

DEFAULT_WINDOW = 3


def _lists_tools(msg: Message) -> bool:
    turn = parse_turn(msg)
    return any(call.name == LIST_TOOLS for call in turn.calls)


def head_length(messages: Sequence[Message]) -> int:
    """How many leading messages always stay: system(s), the task, the first list_tools
    exchange (its assistant turn and the tool answers right after it)."""
    i = 0
    while i < len(messages) and messages[i].role == "system":
        i += 1
    if i < len(messages) and messages[i].role == "user":
        i += 1
    if i < len(messages) and messages[i].role == "assistant" and _lists_tools(messages[i]):
        i += 1
        while i < len(messages) and messages[i].role == "tool":
            i += 1
    return i


def window(messages: Sequence[Message], w: int | None = DEFAULT_WINDOW) -> list[Message]:
    """The messages the policy sees: the head plus the last ``w`` turns (``None``: all)."""
    if w is None:
        return list(messages)
    if w < 0:
        raise ValueError(f"window must be >= 0 or None, not {w}")
    head = head_length(messages)
    starts = [i for i in range(head, len(messages)) if messages[i].role == "assistant"]
    if len(starts) <= w:
        return list(messages)
    cut = starts[len(starts) - w] if w else len(messages)
    return list(messages[:head]) + list(messages[cut:])


@dataclass(frozen=True)
class TurnSample:
    """One training sample: the windowed prompt a turn was generated from, and that turn."""

    turn: int            # 0-based assistant turn in the episode
    prompt: list[Message]
    completion: Message  # the assistant message: the only tokens the loss sees


def samples(messages: Sequence[Message], w: int | None = DEFAULT_WINDOW) -> list[TurnSample]:
    """Split an episode into one sample per assistant turn (history-aware sample splitting)."""
    out = []
    for i, msg in enumerate(messages):
        if msg.role == "assistant":
            out.append(TurnSample(turn=len(out), prompt=window(messages[:i], w), completion=msg))
    return out
