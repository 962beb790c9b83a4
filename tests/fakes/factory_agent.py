"""A scripted QueryGen and a scripted agent on the mock OpenAI server, for the solving gate.

The scripted QueryGen reads the calls in its prompt and writes a request that says each step in a
user's words (what it is about by name, never by id) and the question; it remembers, per request text exactly as written,
the calls a competent agent makes for it. The scripted agent runs through the trainer's real agent
loop (``trainer.episode.run_episode`` with ``OpenAIPolicy`` on the mock): it lists the tools, makes
the calls it understood from the request it was given, then answers. A request it does not know
(emptied prompt, edited text) gets no calls and "I could not tell what you want": the gate must
then reject the episode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from judge.trajectory import LIST_TOOLS
from synth.factory.gate import AgentEndpoint, AgentSolver, register_agent_loop
from tests.fakes.mock_openai import MockOpenAI, SeenRequest
from trainer.episode import EpisodeConfig, run_episode
from trainer.format import call_tool_text, final_text, tool_call_text
from trainer.policy import OpenAIPolicy

_CALL = re.compile(r"^\d+\. (\w+)\(", re.MULTILINE)
_LEARN = re.compile(r"The user wants to learn: (\S+) \(the answer is (.*)\)\.$", re.MULTILINE)


def prompt_calls(prompt: str) -> list[tuple[str, dict[str, Any], Any]]:
    """(tool, arguments, result) of each ``N. tool({...}) -> result`` line of a QueryGen prompt."""
    out = []
    decode = json.JSONDecoder().raw_decode
    for m in _CALL.finditer(prompt):
        args, end = decode(prompt, m.end())
        try:
            result, _ = decode(prompt, prompt.index("-> ", end) + 3)
        except ValueError:  # a result cut short in the prompt
            result = None
        out.append((m.group(1), args, result))
    return out


def query_prompt_of(req: SeenRequest) -> str:
    """QueryGen's prompt (the first user message: a repair request adds more after it)."""
    return next(m["content"] for m in req.messages if m["role"] == "user")


def turn_sizes(prompt: str) -> list[int]:
    """Calls per turn of a QueryGen prompt's ``Turns (...): turn 1: calls 1-2; turn 2: call 3``."""
    line = re.search(r"^Turns \(.*$", prompt, re.MULTILINE)
    spans = re.findall(r"calls? (\d+)(?:-(\d+))?", line.group(0)) if line else []
    return [int(b or a) - int(a) + 1 for a, b in spans]


def _records(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value] + [r for v in value.values() for r in _records(v)]
    return [r for v in value for r in _records(v)] if isinstance(value, list) else []


def _name_of(key: str, value: Any, results: list[Any]) -> str | None:
    """The title/name a user knows an id by: a record of any result holding that id."""
    for rec in (r for res in results for r in _records(res)):
        if (rec.get("id") == value or rec.get(key) == value) and (rec.get("title") or rec.get("name")):
            return str(rec.get("title") or rec.get("name"))
    return None


def describe(calls: list[tuple[str, dict[str, Any], Any]]) -> str:
    """Each step in a user's words: the action, and what it is about (names, not ids)."""
    results = [r for _, _, r in calls]
    steps = []
    for tool, args, _ in calls:
        about = [_name_of(k, v, results) if k == "id" or k.endswith("_id") else str(v) for k, v in args.items()]
        words = tool.replace("_", " ")
        steps.append(f"{words} ({', '.join(a for a in about if a)})" if any(about) else words)
    return ", then ".join(steps)


def refine_echo(req: SeenRequest) -> str:
    """The refinement stage scripted: each turn's drafted message as written (the scripted drafts
    carry one), so the request is exactly what the scripted QueryGen meant."""
    plan = json.loads(query_prompt_of(req).split("The plan, one entry per turn:\n", 1)[1])
    return json.dumps({"messages": [t.get("draft") or f"Hi, {t['goal']} Thanks!" for t in plan["turns"]]})


def script_refine(mock: MockOpenAI) -> None:
    mock.script(refine_echo, stage="queries_refine", repeat=True)


def staged(turns: list[dict[str, Any]]) -> str:
    """A QueryGen answer with every stage: profile, scenario, per turn subgoals, goal, message."""
    return json.dumps({"profile": "A regular user of the app.", "scenario": "They are sorting out their account.",
                       "turns": turns})


def staged_messages(messages: list[str], sizes: list[int]) -> str:
    """A staged answer whose turns say ``messages`` (one generic subgoal per call)."""
    return staged([{"subgoals": ["do it"] * size, "goal": "The user wants this done.", "message": m}
                   for m, size in zip(messages, sizes, strict=True)])


@dataclass
class Plan:
    calls: list[tuple[str, dict[str, Any]]]
    answer: str = "Done, as you asked."


@dataclass
class ScriptedWorld:
    """What the scripted QueryGen wrote and what the scripted agent understands of it."""

    plans: dict[str, Plan] = field(default_factory=dict)
    #: edits the understood plan of a request (a request that says something else than the chain)
    misread: Callable[[Plan], Plan] | None = None
    requests: list[str] = field(default_factory=list)

    def querygen(self, req: SeenRequest) -> str:
        prompt = query_prompt_of(req)
        calls = prompt_calls(prompt)
        learn = _LEARN.search(prompt)
        field_name = learn.group(1).rsplit(".", 1)[-1].strip("[]") if learn else ""
        turns, start = [], 0
        for size in turn_sizes(prompt) or [len(calls)]:
            part = calls[start:start + size]
            start += size
            words = describe(part) if part else "help me with my account"
            turns.append({"subgoals": [tool.replace("_", " ") for tool, _, _ in part] or ["help"],
                          "goal": f"The user wants the assistant to {words}.", "message": f"Could you {words} for me?"})
        if learn:
            turns[-1]["message"] = turns[-1]["message"][:-1] + f", and tell me the {field_name}?"
        text = "\n\n".join(t["message"] for t in turns)  # the farm task the agent reads (model.task_text)
        if calls:
            answer = f"The {field_name} is {learn.group(2).strip(chr(39))}." if learn else "Done, as you asked."
            plan = Plan([(tool, args) for tool, args, _ in calls], answer)
            self.plans[text] = self.misread(plan) if self.misread else plan
        self.requests.append(text)
        return staged(turns)

    def agent(self, req: SeenRequest) -> str:
        task = next(m["content"] for m in req.messages if m["role"] == "user")
        turn = sum(m["role"] == "assistant" for m in req.messages)
        plan = self.plans.get(task)
        if plan is None:
            return final_text("I could not tell what you want.", "The request is unclear.")
        if turn == 0:
            return tool_call_text(LIST_TOOLS, {}, "First I list the tools.")
        if turn <= len(plan.calls):
            tool, args = plan.calls[turn - 1]
            return call_tool_text(tool, args, f"Step {turn}: {tool}.")
        return final_text(plan.answer, "Every step is done.")

    def install(self, mock: MockOpenAI) -> None:
        mock.script(self.querygen, stage="queries", repeat=True)
        script_refine(mock)
        mock.script(self.agent, match=lambda r: r.stage == "", repeat=True)


def scripted_solver(mock: MockOpenAI) -> AgentSolver:
    """The trainer's agent loop on the mock endpoint (answered by ``ScriptedWorld.agent``);
    ``await solver.aclose()`` when done."""
    policy = OpenAIPolicy(mock.url, "agent", max_retries=0)
    return AgentSolver(run_episode, policy, EpisodeConfig(max_turns=12, window=None))  # it counts its turns


def trainer_agent_loop(endpoint: AgentEndpoint) -> AgentSolver:
    """What the composition root registers: the trainer's loop with an OpenAI-compatible policy."""
    policy = OpenAIPolicy(endpoint.base_url, endpoint.model, api_key=endpoint.api_key, max_retries=0)
    return AgentSolver(run_episode, policy, EpisodeConfig(max_turns=endpoint.max_turns, window=None))


def script_world(mock: MockOpenAI, world: ScriptedWorld | None = None) -> ScriptedWorld:
    """Install a scripted QueryGen + agent on ``mock`` and register the trainer's agent loop for
    ``synth queries`` (its ``--agent-*`` endpoint defaults to the LLM's: the mock)."""
    world = world or ScriptedWorld()
    world.install(mock)
    register_agent_loop(trainer_agent_loop)
    return world
