"""QueryGen: the LLM writes the user's request for an executed chain (implicit intent).

The request may be multi-turn (a first message, then follow-ups). An answer that is not the JSON
asked for is asked once more; an answer that names a tool, or states a raw internal id the user
would not know, is rejected. Every outcome is counted; nothing here raises for a bad answer.
"""

from __future__ import annotations

import json
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
You get the API calls the assistant must make (already run, with their results) and write the user's \
request that needs exactly those calls. Implicit intent: say what the user wants, in their own words, \
never a tool or endpoint name and never an internal id number the user cannot know (say "my latest \
loan", "the Dune book", not "loan 17"); values the user knows (names, dates, amounts) may be stated. \
You may split the request into a first message and up to two short follow-ups.
Answer with one JSON object: {"messages": ["<first message>", "<follow-up>", ...]}"""


def _texts(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class QueryAnswer(_Answer):
    messages: Annotated[list[Annotated[str, Field(min_length=3)]], BeforeValidator(_texts)] = Field(
        min_length=1, max_length=4)


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


def query_prompt(env: str, ex: Executed, answer: tuple[str, Any] | None) -> str:
    lines = [f"App: {env}", "", "Calls the assistant makes, in order:"]
    for i, call in enumerate(ex.calls):
        result = json.dumps(call.result, default=str)
        lines.append(f"{i + 1}. {call.tool}({json.dumps(call.arguments, default=str)}) -> {result[:600]}")
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
                      stats: QueryStats) -> tuple[list[str] | None, str]:
    """``(messages, "")`` or ``(None, why)`` with why in malformed | llm_error | names_tool | names_id."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": query_prompt(env, ex, answer)}]
    for attempt in range(2):
        try:
            res = await llm.chat(messages, stage=STAGE, scenario=env, response_format={"type": "json_object"},
                                 salt=f"retry{attempt}" if attempt else None)
        except LLMError:
            stats.llm_errors += 1
            return None, LLM_ERROR
        stats.calls += 1
        stats.prompt_tokens += res.usage.prompt_tokens
        stats.completion_tokens += res.usage.completion_tokens
        stats.cost_usd += res.usage.cost_usd
        try:
            written = [m.strip() for m in parse_answer(res.text, QueryAnswer).messages]
        except ParseError:
            if attempt == 0:
                stats.retried += 1
            continue
        why = leak(written, tools, hidden_ids(ex))
        if why:
            setattr(stats, why, getattr(stats, why) + 1)
            return None, why
        return written, ""
    stats.malformed += 1
    return None, "malformed"
