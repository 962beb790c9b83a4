"""A deterministic request writer for executed chains, where no LLM is at hand: a TEMPLATE, not QueryGen.

QueryGen (``synth.factory.querygen``) has an LLM write what a user would type: implicit intent, no
tool names, no internal ids. Without an LLM, this writer states the chain explicitly, one numbered
step per call: the tool's own one-line summary from the env's API spec, then the arguments the call
was given, as the JSON object the call takes (a summary that spells a tool's name, "List transfers"
for ``list_transfers``, gets another verb: "Show transfers")::

    Step 1: Temporarily lock a card with {"card_id": 3}. Step 2: Transfer money with {"from_account_id": 1, "to_account_id": 2, "amount": 50.0}.

An agent can do what it says without guessing (every value it needs is in the text, ids included:
this writer is explicit by design), and cannot learn it by heart (the values change from draw to
draw). It never names a tool; a summary that would (the whole snake_case name) is refused like
QueryGen's ``names_tool``. Anything built on it says so: its requests are labelled ``WRITER`` in
every record and figure, and they are not evidence of how a model handles a real user's request.
"""

from __future__ import annotations

import json
from typing import Any

from synth.factory.execute import Executed
from synth.factory.querygen import QueryPlan, QueryStats, leak

#: the label every record, report and figure built on these requests carries
WRITER = "template writer (no LLM)"

#: another verb for a summary whose words are a tool's name ("List transfers": list_transfers)
SYNONYMS = {"list": "Show", "get": "Fetch", "search": "Look through", "update": "Change", "create": "Make",
            "delete": "Erase", "add": "Put in", "remove": "Take out", "log": "Record", "run": "Execute",
            "start": "Begin", "complete": "Finish", "watch": "Follow", "cancel": "Call off", "set": "Make",
            "check": "Verify", "mark": "Flag", "send": "Write", "edit": "Revise", "find": "Look up",
            "change": "Alter", "lock": "Freeze", "unlock": "Unfreeze", "book": "Reserve", "save": "Keep",
            "review": "Rate", "withdraw": "Take back", "contribute": "Pay in", "schedule": "Plan",
            "transfer": "Move", "report": "Declare", "dispute": "Contest", "stop": "Quit"}


def value_text(value: Any) -> str:
    """A value as the request states it: JSON, so a string keeps its quotes and a number its form."""
    return json.dumps(value, ensure_ascii=False, default=str)


def step_sentence(summary: str, arguments: dict[str, Any]) -> str:
    """One call as a sentence: ``Summary with {"name": value, ...}.`` (``Summary.`` without
    arguments): the arguments as the JSON object the call takes, so following the request is
    copying it, not rewriting it."""
    head = summary.strip().rstrip(".") or "Do the next step"
    if not arguments:
        return f"{head}."
    return f"{head} with {value_text(arguments)}."


def first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0]


def unnamed(summary: str, tools: list[str]) -> str:
    """``summary``, or, when it spells a tool's name ("List transfers"), the same with its first
    word replaced by a synonym ("Show transfers"); unchanged when no synonym cures it."""
    if leak([summary], tools, set()) is None:
        return summary
    verb, _, rest = summary.partition(" ")
    other = SYNONYMS.get(verb.lower())
    fixed = f"{other} {rest}".strip() if other else summary
    return fixed if leak([fixed], tools, set()) is None else summary


class TemplateWriter:
    """Writes each executed chain's request from a template (module doc); the same chain and
    values always give the same text."""

    label = WRITER

    def __init__(self, summaries: dict[str, str]) -> None:
        #: tool -> the one-line summary the request uses for it
        self.summaries = summaries

    @classmethod
    def for_tools(cls, tools: list[Any]) -> TemplateWriter:
        """From an env's tool specs: the first line of each description, its verb replaced
        (``SYNONYMS``) where the summary spells a tool's name as words."""
        names = [t.name for t in tools]
        return cls({t.name: unnamed(first_line(t.description or t.name), names) for t in tools})

    def message(self, ex: Executed) -> str:
        return " ".join(f"Step {k}: " + step_sentence(self.summaries.get(c.tool, c.tool), c.arguments)
                        for k, c in enumerate(ex.calls, 1))

    async def write(self, env: str, ex: Executed, tools: list[str], answer: tuple[str, Any] | None,
                    stats: QueryStats, **_: Any) -> tuple[QueryPlan | None, list[int], str]:
        """What ``synth.factory.querygen.write_query`` returns, without an LLM: ``(plan, [calls], "")``,
        or ``(None, [calls], "names_tool")`` when a summary names a tool. Every argument is stated
        (``ex.stated``), so the honest gate's ambiguity check sees ids the request gives."""
        text = self.message(ex)
        if answer is not None:
            text += f" Then tell me the {answer[0].rsplit('.', 1)[-1].strip('[]').replace('_', ' ')}."
        turns = [len(ex.calls)]
        why = leak([text], tools, set())  # the ids are stated on purpose: only tool names are refused
        if why:
            setattr(stats, why, getattr(stats, why) + 1)
            return None, turns, why
        ex.stated.update({k: v for c in ex.calls for k, v in c.arguments.items()})
        plan = QueryPlan(profile=f"A user of {env} ({WRITER}).", scenario="They ask for each step explicitly.",
                         turns=[{"subgoals": [self.summaries.get(c.tool, c.tool) for c in ex.calls],
                                 "goal": text, "message": text}])
        return plan, turns, ""
