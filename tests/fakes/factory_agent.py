"""A scripted QueryGen and an honest scripted agent on the mock OpenAI server, for the solving gate.

The scripted QueryGen reads the calls in its prompt and writes a request that says each step in a
user's words (``tests.fakes.factory_words``: no tool names, records by their names, never by id)
and the question. The scripted agent runs through the trainer's real agent loop
(``trainer.episode.run_episode`` with ``OpenAIPolicy`` on the mock) and knows nothing but the
request and what the farm answers it: it lists the tools, reads the request back into steps,
finds each record it names by reading (a list tool, then the one record that name fits), calls,
and answers. When the request is ambiguous (a record it does not name among several, a name that
fits several, a question whose answer has several values) or says nothing it can act on, it
says so and stops, and the gate must then reject the episode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from judge.trajectory import LIST_TOOLS, Message, parse_turn
from synth.factory.gate import AgentEndpoint, AgentSolver, register_agent_loop
from tests.fakes.mock_openai import MockOpenAI, SeenRequest
from tests.fakes.factory_words import HonestReader, id_param, records, say_step, words
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


def _groups(value: Any) -> list[list[dict[str, Any]]]:
    """Every list of records in an answer (a record outside a list is a list of one)."""
    if isinstance(value, list):
        items = [v for v in value if isinstance(v, dict)]
        return ([items] if items else []) + [g for v in value for g in _groups(v)]
    if isinstance(value, dict):
        return [[value]] + [g for v in value.values() for g in _groups(v)]
    return []


def _name_of(key: str, value: Any, calls: list[tuple[str, dict[str, Any], Any]]) -> str | None:
    """What a user calls the record an id points to, from an answer of a tool about that thing
    (``list_payment_methods`` for a ``payment_method_id``): its title or name, else a value of
    it that none of the records listed beside it has ('Mastercard')."""
    entity = key[:-3].rstrip("_")
    for tool, _, result in calls:
        if not entity or entity.rstrip("s") not in tool:
            continue
        for group in _groups(result):
            for rec in (r for r in group if r.get("id") == value):
                if rec.get("title") or rec.get("name"):
                    return str(rec.get("title") or rec.get("name"))
                for k, v in rec.items():
                    if isinstance(v, str) and len(v) >= 3 and not id_param(k) and "'" not in v \
                            and all(o.get(k) != v for o in group if o is not rec):
                        return v
    return None


def describe(calls: list[tuple[str, dict[str, Any], Any]], first: int, count: int) -> list[str]:
    """Steps ``first``.. of the chain in a user's words (``factory_words.say_step``): a record
    by its name when some answer names it, as "from before" when an earlier step's answer
    returned it, else unsaid."""
    results = [r for _, _, r in calls]
    steps = []
    for i in range(first, first + count):
        tool, args, _ = calls[i]
        refs, values = [], []
        for key, value in args.items():
            if not id_param(key):
                values.append((key, value))
            elif (name := _name_of(key, value, calls)) is not None:
                refs.append((key, name))
            elif any(r.get(key) == value for res in results[:i] for r in records(res)):
                refs.append((key, None))
        steps.append(say_step(tool, refs, values))
    return steps


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


def _tool_answer(msg: dict[str, Any]) -> dict[str, Any] | None:
    """The farm's answer in a tool message (role ``tool``, or the user turn the Qwen3 format
    wraps in ``<tool_response>``); None for any other message."""
    text = msg.get("content") or ""
    if msg["role"] == "user" and text.startswith("<tool_response>"):
        text = text.removeprefix("<tool_response>").rsplit("</tool_response>", 1)[0]
    elif msg["role"] != "tool":
        return None
    return json.loads(text)


def _conversation(req: SeenRequest) -> HonestReader:
    """What the agent knows: the request, the tool listing, and each of its calls' answers."""
    msgs = req.messages
    task = next(m["content"] for m in msgs if m["role"] == "user")
    tools: dict[str, dict[str, Any]] = {}
    history: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for said, reply in zip(msgs, msgs[1:], strict=False):
        body = _tool_answer(reply)
        if said["role"] != "assistant" or body is None:
            continue
        call = parse_turn(Message(role="assistant", content=said["content"])).calls
        if call and call[0].name == LIST_TOOLS:
            tools = {t["name"]: t.get("input_schema") or {} for t in body.get("result") or []}
        elif call:
            history.append((call[0].arguments["tool_name"], json.loads(call[0].arguments["arguments"]), body))
    return HonestReader(task, tools, history)


@dataclass
class ScriptedWorld:
    """The scripted QueryGen and the honest scripted agent on one mock endpoint."""

    #: edits the written request (a request that says something else than the chain did)
    misread: Callable[[str], str] | None = None
    requests: list[str] = field(default_factory=list)

    def querygen(self, req: SeenRequest) -> str:
        prompt = query_prompt_of(req)
        calls = prompt_calls(prompt)
        learn = _LEARN.search(prompt)
        turns, start = [], 0
        for size in turn_sizes(prompt) or [len(calls)]:
            part = calls[start:start + size]
            steps = describe(calls, start, len(part))
            start += size
            message = f"Could you {', then '.join(steps)} for me?" if steps else "Could you help me with my account?"
            turns.append({"subgoals": [tool.replace("_", " ") for tool, _, _ in part] or ["help"],
                          "goal": "The user wants the assistant to do this.", "message": message})
        if learn:
            turns[-1]["message"] = turns[-1]["message"][:-1] + f", and tell me the {words(learn.group(1).rsplit('.', 1)[-1].strip('[]'))}?"
        if self.misread:
            for turn in turns:
                turn["message"] = self.misread(turn["message"])
        self.requests.append("\n\n".join(t["message"] for t in turns))  # the farm task (model.task_text)
        return staged(turns)

    def agent(self, req: SeenRequest) -> str:
        reader = _conversation(req)
        if not any(m["role"] == "assistant" for m in req.messages):
            return tool_call_text(LIST_TOOLS, {}, "First I list the tools.")
        action = reader.next_action()
        if isinstance(action, str):
            return final_text(action, "That is all I can do with what the request says.")
        tool, args = action
        return call_tool_text(tool, args, f"The request asks for this: {tool}.")

    def install(self, mock: MockOpenAI) -> None:
        mock.script(self.querygen, stage="queries", repeat=True)
        script_refine(mock)
        mock.script(self.agent, match=lambda r: r.stage == "", repeat=True)


def scripted_solver(mock: MockOpenAI) -> AgentSolver:
    """The trainer's agent loop on the mock endpoint (answered by ``ScriptedWorld.agent``);
    ``await solver.aclose()`` when done."""
    policy = OpenAIPolicy(mock.url, "agent", max_retries=0)
    # it reads every answer whole, and rebuilds its plan from the whole conversation
    return AgentSolver(run_episode, policy, EpisodeConfig(max_turns=16, window=None, max_tool_chars=1 << 20))


def run_episodes(runtime: Any, chains: list[Any], mock: MockOpenAI, sandbox: Any, columns: Any = None) -> list[Any]:
    """``make_episodes`` on ``chains`` with the scripted agent on ``mock`` (whose world the caller
    installed)."""
    import asyncio

    from envfarm.llm import LLMClient, LLMConfig
    from synth.factory.dbvalues import db_columns
    from synth.factory.queries import make_episodes

    async def main() -> list[Any]:
        solver = scripted_solver(mock)
        try:
            async with LLMClient(LLMConfig(base_url=mock.url, model="mock", max_retries=0)) as llm:
                return await make_episodes(runtime, chains, columns if columns is not None else
                                           db_columns(runtime.template.data), llm, sandbox, solver)
        finally:
            await solver.aclose()

    return asyncio.run(main())


def trainer_agent_loop(endpoint: AgentEndpoint) -> AgentSolver:
    """What the composition root registers: the trainer's loop with an OpenAI-compatible policy."""
    policy = OpenAIPolicy(endpoint.base_url, endpoint.model, api_key=endpoint.api_key, max_retries=0)
    return AgentSolver(run_episode, policy, EpisodeConfig(max_turns=endpoint.max_turns, window=None,
                                                          max_tool_chars=1 << 20))


def script_world(mock: MockOpenAI, world: ScriptedWorld | None = None) -> ScriptedWorld:
    """Install a scripted QueryGen + agent on ``mock`` and register the trainer's agent loop for
    ``synth queries`` (its ``--agent-*`` endpoint defaults to the LLM's: the mock)."""
    world = world or ScriptedWorld()
    world.install(mock)
    register_agent_loop(trainer_agent_loop)
    return world
