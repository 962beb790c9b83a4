"""QueryGen: the LLM writes the user's request for an executed chain (implicit intent).

The calls are planned into 1-3 user turns of 1-5 calls each; the request has one message per turn
(a first message, then follow-ups). An answer that does not fit (not the JSON asked for, not one
message per turn) is asked once more with what was wrong; obvious variants (a bare list,
``{role, content}`` objects) are read as meant; an answer that names a tool, or states a raw internal id the user
would not know, is rejected. Every outcome is counted; nothing here raises for a bad answer.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from envfarm.errors import LLMError
from synth._answers import _Answer, parse_answer
from synth._parse import ParseError
from synth.factory.dbvalues import strict_id
from synth.factory.execute import Executed

STAGE = "queries"
#: the rejection reason of an episode whose request the endpoint failed to write (retried on a re-run)
LLM_ERROR = "llm_error"

SYSTEM = """You write what a real user of an app types to an assistant that uses the app's API. \
You get the API calls the assistant must make (already run, with their results), split into turns, and \
write the user's request that needs exactly those calls: one message per turn, each asking for what its \
turn's calls do (a later message may build on what the assistant answered). Implicit intent: say what \
the user wants, in their own words, never a tool or endpoint name and never an internal id number the \
user cannot know (say "my latest loan", "the Dune book", not "loan 17"); values the user knows (names, \
dates, amounts) may be stated.
Answer with one JSON object: {"messages": ["<message of turn 1>", "<message of turn 2>", ...]}"""

#: most tools one user turn asks for (the paper's turns of 1-5 tool calls)
MAX_TURN_CALLS = 5


def plan_turns(n_calls: int, seed: str) -> list[int]:
    """Calls per user turn: 1..3 turns (never more than calls), each of 1..``MAX_TURN_CALLS`` calls,
    deterministic under ``seed``."""
    rng = random.Random(seed)
    least = -(-n_calls // MAX_TURN_CALLS)
    k = rng.randint(least, max(least, min(3, n_calls)))
    cuts = sorted(rng.sample(range(1, n_calls), k - 1)) if k > 1 else []
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, n_calls], strict=True)]
    if max(sizes) > MAX_TURN_CALLS:  # an unlucky cut: share out evenly instead
        sizes = [n_calls // k + (i < n_calls % k) for i in range(k)]
    return sizes


def _message_text(value: Any) -> Any:
    """A message as text: a string, or the content of a ``{role, content}`` object."""
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return value


def _texts(value: Any) -> Any:
    if isinstance(value, (str, dict)):
        value = [value]
    return [_message_text(v) for v in value] if isinstance(value, list) else value


class QueryAnswer(_Answer):
    messages: Annotated[list[Annotated[str, Field(min_length=3)]], BeforeValidator(_texts)] = Field(
        min_length=1, max_length=8)


def parse_query(text: str, turns: int) -> list[str]:
    """The messages of an answer, one per planned turn (``{"messages": [...]}``, a bare list, or
    ``{role, content}`` objects); ParseError saying what is wrong otherwise."""
    try:
        messages = parse_answer(text, QueryAnswer).messages
    except ParseError:
        try:
            value = json.loads(text.strip().removeprefix("```json").removeprefix("```").removesuffix("```"))
        except json.JSONDecodeError:
            raise ParseError('not the JSON asked for: {"messages": ["..."]}') from None
        if not isinstance(value, list):
            raise
        messages = parse_answer(json.dumps({"messages": value}), QueryAnswer).messages
    messages = [m.strip() for m in messages]
    if len(messages) != turns:
        raise ParseError(f"{len(messages)} messages for {turns} turns: write exactly one message per turn")
    return messages


@dataclass
class QueryStats:
    """What QueryGen did in one env, for ``synth report``."""

    calls: int = 0
    retried: int = 0
    malformed: int = 0       # not the JSON asked for, after the retry
    llm_errors: int = 0
    names_tool: int = 0
    names_id: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add(self, other: QueryStats) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)


def query_prompt(env: str, ex: Executed, answer: tuple[str, Any] | None, turns: list[int]) -> str:
    lines = [f"App: {env}", "", "Calls the assistant makes, in order:"]
    for i, call in enumerate(ex.calls):
        result = json.dumps(call.result, default=str)
        lines.append(f"{i + 1}. {call.tool}({json.dumps(call.arguments, default=str)}) -> {result[:600]}")
    start, parts = 1, []
    for t, size in enumerate(turns):
        span = f"call {start}" if size == 1 else f"calls {start}-{start + size - 1}"
        parts.append(f"turn {t + 1}: {span}")
        start += size
    lines += ["", f"Turns ({len(turns)} message{'s' if len(turns) > 1 else ''}): " + "; ".join(parts)]
    if ex.stated:
        lines += ["", "Values the user states: " + json.dumps(ex.stated, default=str)]
    if answer is not None:
        lines += ["", f"The user wants to learn: {answer[0]} (the answer is {answer[1]!r})."]
    elif ex.changed:
        lines += ["", "The user wants the change these calls make."]
    return "\n".join(lines)


def hidden_ids(ex: Executed) -> set[str]:
    """Surrogate-key values the chain used that the user did not state."""
    return {str(v) for call in ex.calls for k, v in call.arguments.items()
            if strict_id(k) and k not in ex.stated and isinstance(v, (int, str)) and str(v).strip()}


def leak(messages: list[str], tools: list[str], ids: set[str]) -> str | None:
    """"names_tool" / "names_id" when the request gives away a tool or a raw id, else None."""
    text = " ".join(messages)
    for tool in tools:
        if re.search(rf"\b{re.escape(tool)}\b", text, re.IGNORECASE):
            return "names_tool"
    for value in ids:
        near = rf"(?:\bid\b|#|\bnumber\b|\bno\.)\s*:?\s*{re.escape(value)}\b"
        if re.search(near, text, re.IGNORECASE) or (len(value) >= 3 and re.search(rf"\b{re.escape(value)}\b", text)):
            return "names_id"
    return None


async def write_query(llm: Any, env: str, ex: Executed, tools: list[str], answer: tuple[str, Any] | None,
                      stats: QueryStats) -> tuple[list[str] | None, list[int], str]:
    """``(messages, turn_calls, "")`` or ``(None, turn_calls, why)`` with why in malformed |
    llm_error | names_tool | names_id. An answer that does not fit is asked again once, with what
    was wrong."""
    turns = plan_turns(len(ex.calls), ex.chain.chain_id)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": query_prompt(env, ex, answer, turns)}]
    for attempt in range(2):
        try:
            res = await llm.chat(messages, stage=STAGE, scenario=env, response_format={"type": "json_object"},
                                 salt=f"retry{attempt}" if attempt else None)
        except LLMError:
            stats.llm_errors += 1
            return None, turns, LLM_ERROR
        stats.calls += 1
        stats.prompt_tokens += res.usage.prompt_tokens
        stats.completion_tokens += res.usage.completion_tokens
        stats.cost_usd += res.usage.cost_usd
        try:
            written = parse_query(res.text, len(turns))
        except ParseError as exc:
            if attempt == 0:
                stats.retried += 1
                messages += [{"role": "assistant", "content": res.text[:4000]},
                             {"role": "user", "content": f"Your answer could not be used: {exc}. Answer again."}]
            continue
        why = leak(written, tools, hidden_ids(ex))
        if why:
            setattr(stats, why, getattr(stats, why) + 1)
            return None, turns, why
        return written, turns, ""
    stats.malformed += 1
    return None, turns, "malformed"
