"""QueryGen: the LLM writes the user's request for an executed chain (implicit intent).

The calls are planned into 1-3 user turns of 1-5 calls each. Two LLM calls, each answer checked
(every prompt of QueryGen is in this module):

1. the draft (``SYSTEM``): a user profile and a scenario, then per turn its subgoals (one per call)
   and the goal articulated explicitly;
2. the calibrated refinement (``REFINE_SYSTEM``): each turn's goal rewritten as this user would type
   it (implicit reference, values the user knows, no tool names, no ids); the messages are the
   request (a first message, then follow-ups). A message that copies its goal is sent back.

An answer that does not fit is asked once more with what was wrong; obvious variants (``{role,
content}`` messages, a single subgoal as a string, turns as an object) are read as meant; a request
that names a tool, or states a raw internal id the user would not know, is rejected. Every outcome
is counted; nothing here raises for a bad answer.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from envfarm.errors import LLMError
from synth._answers import _Answer, parse_answer
from synth._parse import ParseError
from synth._usage import count_call
from synth.factory.candidates import singular
from synth.factory.dbvalues import strict_id
from synth.factory.execute import Executed
from synth.factory.verifier import states

STAGE = "queries"
REFINE_STAGE = "queries_refine"
#: the rejection reason of an episode whose request the endpoint failed to write (retried on a re-run)
LLM_ERROR = "llm_error"

SYSTEM = """You plan what a real user of an app asks an assistant that uses the app's API. \
You get the API calls the assistant must make (already run, with their results), split into turns. \
Work in stages and write each one down:
1. profile: who this user is, in one sentence;
2. scenario: the situation that makes them ask, in one sentence;
then for each turn, in order:
3. subgoals: what each call of the turn achieves for the user, one short phrase per call, in order;
4. goal: the turn's goal as one explicit sentence (what must be done, with the values involved).
Answer with one JSON object: {"profile": "...", "scenario": "...", "turns": [{"subgoals": ["..."], \
"goal": "..."}]} with exactly one entry per turn."""

REFINE_SYSTEM = """You turn a user's explicit goals into the messages this user would really type \
to an assistant, one message per turn. Calibrate each like a person: refer to things implicitly \
where the user or the conversation makes them clear ("my latest booking", "that hotel", "the one I \
just made"), leave out what the assistant can look up, keep values the user knows (names, dates, \
amounts), never a tool, endpoint, table or field name (not "delete payment method", not \
"borrower_name") and never an internal id number the user cannot know (say "the Dune book", not \
"book 17"). Say enough for the assistant to find exactly the thing meant when there are several \
("my Visa ending 4242", not "my card"; "my latest booking" is fine), and never state what the \
user asks to learn. A later message may build on what the assistant answered. Do not copy the goal.
Answer with one JSON object: {"messages": ["<turn 1 message>", ...]} with exactly one message per turn."""

#: characters of each call's answer the writer sees (what it can name a record by)
RESULT_CHARS = 2_000
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


def _listed(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _turn_list(value: Any) -> Any:
    """Turns as a list (a ``{"turn 1": {...}}`` object is read in its order)."""
    return list(value.values()) if isinstance(value, dict) else value


Phrase = Annotated[str, Field(min_length=3)]


class QueryTurn(_Answer):
    subgoals: Annotated[list[Phrase], BeforeValidator(_listed)] = Field(min_length=1)
    goal: Phrase
    #: the calibrated message (the refinement stage's; a draft may carry one, which it replaces)
    message: Annotated[str, BeforeValidator(_message_text)] = ""


class Refined(_Answer):
    """The refinement stage's answer: one calibrated message per turn."""

    messages: Annotated[list[Annotated[Phrase, BeforeValidator(_message_text)]], BeforeValidator(_listed)] = Field(
        min_length=1)


class QueryPlan(_Answer):
    """QueryGen's stages: who asks and why, then per turn its subgoals, goal and message."""

    profile: Phrase
    scenario: Phrase
    turns: Annotated[list[QueryTurn], BeforeValidator(_turn_list)] = Field(min_length=1, max_length=8)


def parse_query(text: str, turns: list[int]) -> QueryPlan:
    """QueryGen's draft with every stage checked against the planned ``turns`` (calls per turn):
    one entry per turn, one subgoal per call; ParseError saying what is wrong otherwise."""
    plan = parse_answer(text, QueryPlan)
    if len(plan.turns) != len(turns):
        raise ParseError(f"{len(plan.turns)} turns for {len(turns)} planned: write exactly one entry per turn")
    for i, (turn, calls) in enumerate(zip(plan.turns, turns, strict=True)):
        if len(turn.subgoals) != calls:
            raise ParseError(f"turn {i + 1} has {len(turn.subgoals)} subgoals for its {calls} calls: one per call")
    return plan


def parse_refined(text: str, plan: QueryPlan) -> list[str]:
    """The refinement's messages, one per turn of ``plan``, none a copy of its turn's goal."""
    messages = [m.strip() for m in parse_answer(text, Refined).messages]
    if len(messages) != len(plan.turns):
        raise ParseError(f"{len(messages)} messages for {len(plan.turns)} turns: write exactly one per turn")
    for i, (message, turn) in enumerate(zip(messages, plan.turns, strict=True)):
        if _words(message) == _words(turn.goal):  # the calibration did not happen
            raise ParseError(f"message {i + 1} repeats its goal word for word: write it as this user would type "
                             "it (implicit references, what they know)")
    return messages


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


@dataclass
class QueryStats:
    """What QueryGen did in one env, for ``synth report``."""

    calls: int = 0
    retried: int = 0
    malformed: int = 0       # not the JSON asked for, after the retry
    llm_errors: int = 0
    names_tool: int = 0
    names_id: int = 0
    names_column: int = 0
    names_answer: int = 0
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
        # the writer must see what it names: a list's later items too
        lines.append(f"{i + 1}. {call.tool}({json.dumps(call.arguments, default=str)}) -> {result[:RESULT_CHARS]}")
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


def refine_prompt(query: str, plan: QueryPlan) -> str:
    draft = {"profile": plan.profile, "scenario": plan.scenario,
             "turns": [{"subgoals": t.subgoals, "goal": t.goal, **({"draft": t.message} if t.message else {})}
                       for t in plan.turns]}
    return f"{query}\n\nThe plan, one entry per turn:\n{json.dumps(draft, indent=1)}"


def hidden_ids(ex: Executed) -> set[str]:
    """Surrogate-key values the chain used that the user did not state."""
    return {str(v) for call in ex.calls for k, v in call.arguments.items()
            if strict_id(k) and k not in ex.stated and isinstance(v, (int, str)) and str(v).strip()}


def leak(messages: list[str], tools: list[str], ids: set[str], *, columns: Iterable[str] = (),
         answer: Any = None) -> str | None:
    """Why the request gives away what the agent should work out, or None: ``names_tool`` (a
    tool's name, also written as words: "delete payment method"), ``names_id`` (a raw id the user
    cannot know: "id 17", "#17", "loan 17"), ``names_column`` (a table or column name as the
    schema writes it: "borrower_name"), ``names_answer`` (a question whose request already states
    its answer: the agent could echo it)."""
    text = " ".join(messages)
    for tool in tools:
        if re.search(rf"\b{re.escape(tool)}\b", text, re.IGNORECASE) or _as_words(tool, text):
            return "names_tool"
    names = [c for c in columns if c]
    entities = {singular(n.lower()) for n in names if "_" not in n} | {n.lower() for n in names if "_" not in n}
    for value in ids:
        near = rf"(?:\bid\b|#|\bnumber\b|\bno\.)\s*:?\s*{re.escape(value)}\b"
        if re.search(near, text, re.IGNORECASE) or (len(value) >= 3 and re.search(rf"\b{re.escape(value)}\b", text)):
            return "names_id"
        if any(re.search(rf"\b{re.escape(e)}s?\s+#?{re.escape(value)}\b", text, re.IGNORECASE) for e in entities):
            return "names_id"
    if any("_" in n and re.search(rf"\b{re.escape(n)}\b", text, re.IGNORECASE) for n in names):
        return "names_column"
    if answer is not None and states(text, answer):
        return "names_answer"
    return None


def _as_words(tool: str, text: str) -> bool:
    """``delete_payment_method`` written as "delete payment method(s)" (tools of two words or more)."""
    words = [w for w in tool.lower().split("_") if w]
    if len(words) < 2:
        return False
    pattern = r"[\s-]+".join(rf"{re.escape(singular(w))}(?:e?s)?" for w in words)
    return re.search(rf"\b{pattern}\b", text, re.IGNORECASE) is not None


async def write_query(llm: Any, env: str, ex: Executed, tools: list[str], answer: tuple[str, Any] | None,
                      stats: QueryStats, columns: Iterable[str] = ()) -> tuple[QueryPlan | None, list[int], str]:
    """``(plan, turn_calls, "")`` or ``(None, turn_calls, why)`` with why in malformed | llm_error |
    names_tool | names_id | names_column | names_answer (``leak``): the draft, then the calibrated
    refinement (``plan.turns[i].message``). ``columns``: the database's table and column names."""
    turns = plan_turns(len(ex.calls), ex.chain.chain_id)
    query = query_prompt(env, ex, answer, turns)
    plan = await _ask(llm, env, SYSTEM, query, STAGE, lambda text: parse_query(text, turns), stats)
    if not isinstance(plan, QueryPlan):
        return None, turns, plan
    messages = await _ask(llm, env, REFINE_SYSTEM, refine_prompt(query, plan), REFINE_STAGE,
                          lambda text: parse_refined(text, plan), stats)
    if isinstance(messages, str):
        return None, turns, messages
    for turn, message in zip(plan.turns, messages, strict=True):
        turn.message = message
    why = leak(messages, tools, hidden_ids(ex), columns=columns, answer=answer[1] if answer else None)
    if why:
        setattr(stats, why, getattr(stats, why) + 1)
        return None, turns, why
    return plan, turns, ""


async def _ask(llm: Any, env: str, system: str, prompt: str, stage: str, parse: Any, stats: QueryStats) -> Any:
    """One stage's answer through ``parse``, asked once more with what was wrong; on failure the
    reason (``malformed`` or ``llm_error``) as a string."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    for attempt in range(2):
        try:
            res = await llm.chat(messages, stage=stage, scenario=env, response_format={"type": "json_object"},
                                 salt=f"retry{attempt}" if attempt else None)
        except LLMError:
            stats.llm_errors += 1
            return LLM_ERROR
        count_call(stats, res)
        try:
            return parse(res.text)
        except ParseError as exc:
            if attempt == 0:
                stats.retried += 1
                messages += [{"role": "assistant", "content": res.text[:4000]},
                             {"role": "user", "content": f"Your answer could not be used: {exc}. Answer again."}]
    stats.malformed += 1
    return "malformed"
