"""The self-correction loop every stage shares: generate, run, summarize the error, retry."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from synth import prompts
from synth._context import Meter, RunContext
from synth._parse import ParseError, extract_json


@dataclass
class Attempt:
    """How one candidate fared: accepted or not, why, and a score to pick the best by."""

    ok: bool
    value: Any = None
    errors: list[str] = field(default_factory=list)
    score: float = float("-inf")
    excerpt: str = ""  # the code that failed, shown to the summarizer
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoopResult:
    """The accepted candidate, or the best failing one, and what every attempt said."""

    best: Attempt | None
    accepted: bool
    attempts: int
    history: list[list[str]] = field(default_factory=list)

    @property
    def last_errors(self) -> list[str]:
        return self.history[-1] if self.history else []


Evaluate = Callable[[str], Awaitable[Attempt]]


async def self_correct(
    ctx: RunContext,
    meter: Meter,
    *,
    stage: str,
    scenario: str,
    messages: list[dict[str, Any]],
    evaluate: Evaluate,
    executable: bool,
    json_mode: bool = True,
    max_attempts: int | None = None,
    salt: str | None = None,
) -> LoopResult:
    """Up to ``max_attempts`` generations; after a failure the (summarized) error joins the prompt.

    Executable stages ask the LLM to summarize the failure (root cause, problem code, guidance)
    first, as AWM does; the others feed the validation errors back verbatim.
    """
    limit = max_attempts or ctx.config.max_attempts
    convo = list(messages)
    best: Attempt | None = None
    history: list[list[str]] = []
    for attempt in range(1, limit + 1):
        text = await ctx.chat(meter, convo, stage=stage, scenario=scenario, json_mode=json_mode, salt=salt)
        outcome = await evaluate(text)
        history.append(outcome.errors)
        if best is None or outcome.score > best.score or outcome.ok:
            best = outcome
        if outcome.ok:
            return LoopResult(best=outcome, accepted=True, attempts=attempt, history=history)
        if attempt == limit:
            break
        feedback = "\n".join(f"- {e}" for e in outcome.errors[:20])
        if executable:
            summary = await summarize(ctx, meter, stage=stage, scenario=scenario, errors=outcome.errors,
                                      excerpt=outcome.excerpt or text)
            feedback = prompts.format_summary(summary) + "\n\nRaw errors:\n" + feedback
        # Keep only the latest failed answer in the conversation: bounded prompts, full context.
        convo = [*messages, {"role": "assistant", "content": text},
                 {"role": "user", "content": prompts.retry_message(stage, attempt, feedback)}]
    return LoopResult(best=best, accepted=False, attempts=len(history), history=history)


async def summarize(ctx: RunContext, meter: Meter, *, stage: str, scenario: str, errors: list[str],
                    excerpt: str, extra: str = "") -> dict[str, Any]:
    """Ask the LLM for ``{root_cause, problem_code, guidance, ...}``; raw errors if it cannot say."""
    text = await ctx.chat(meter, prompts.summarize_messages(stage, errors, excerpt, extra),
                          stage=f"{stage}.fix", scenario=scenario, temperature=ctx.config.fix_temperature)
    try:
        data = extract_json(text)
    except ParseError:
        return {"root_cause": "; ".join(errors[:5]), "problem_code": "", "guidance": text[:2000]}
    return {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in data.items()}
