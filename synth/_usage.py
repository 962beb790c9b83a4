"""Counting LLM use: one place adds a call's usage, for stage meters and factory steps alike."""

from __future__ import annotations

from typing import Protocol

from envfarm.llm import ChatResult


class LLMCounts(Protocol):
    """Counters of LLM use: a stage's ``Meter``, or the stats a factory step reports."""

    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


def count_call(counts: LLMCounts, res: ChatResult) -> None:
    """Add one answered call and its usage to ``counts``: the one place usage is added up."""
    counts.calls += 1
    counts.prompt_tokens += res.usage.prompt_tokens
    counts.completion_tokens += res.usage.completion_tokens
    counts.cost_usd += res.usage.cost_usd
