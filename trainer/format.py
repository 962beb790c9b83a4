"""The Qwen3 chat format of the agent loop: the system prompt, rendering, and reading a turn.

An assistant turn is ``<think>…</think>`` then exactly one
``<tool_call>{"name": …, "arguments": …}</tool_call>`` (or, to finish, a final answer without a
call). The agent sees two meta-tools, ``list_tools`` and ``call_tool(tool_name, arguments: JSON
string)``; a tool's answer comes back as a ``tool`` message holding the farm's call answer as
JSON. Parsing is the judge's (``judge.trajectory.parse_turn``), so the loop and the format rules
read a turn the same way.

``render`` is the one place a conversation becomes model text; ``CHAT_TEMPLATE`` (saved with the
tiny model's tokenizer) renders the same text, so a vLLM/SGLang server of that checkpoint shows
the model what the local policy shows it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from judge import Message
from judge.trajectory import CALL_TOOL, LIST_TOOLS, MetaToolCall, parse_turn

IM_START, IM_END = "<|im_start|>", "<|im_end|>"

META_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": LIST_TOOLS,
        "description": "List the environment's tools with their descriptions and argument "
                       "schemas. Call it exactly once, first.",
        "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {
        "name": CALL_TOOL,
        "description": "Call one of the environment's tools.",
        "parameters": {"type": "object", "required": ["tool_name", "arguments"], "properties": {
            "tool_name": {"type": "string", "description": "a name list_tools returned"},
            "arguments": {"type": "string",
                          "description": "the tool's arguments as a JSON object string"}}}}},
]

SYSTEM_INSTRUCTIONS = (
    "You are an agent that completes the user's task with the environment's tools. "
    "In every turn, first reason inside <think></think>, then either make exactly one tool "
    "call, or, when the task is done, give your final answer without a tool call.")


#: The system prompt of tiny CPU models (``system: brief``): the format in one sentence; the
#: model learns the rest from its SFT episodes (prompt length is what a CPU pays for).
BRIEF_SYSTEM = ("Complete the task with the tools: first call list_tools, then call_tool once per "
                "step, each turn <think>...</think> then <tool_call>, and answer without a call.")


def system_text(kind: str) -> str:
    """The system prompt named by a config: ``full`` or ``brief``."""
    if kind not in ("full", "brief"):
        raise ValueError(f"system prompt {kind!r}: full or brief")
    return BRIEF_SYSTEM if kind == "brief" else system_prompt()


def system_prompt(instructions: str = SYSTEM_INSTRUCTIONS) -> str:
    """The system message: instructions plus the meta-tools, the way Qwen3 lists tools."""
    tools = "\n".join(json.dumps(t) for t in META_TOOLS)
    return (f"{instructions}\n\n# Tools\n\nYou may call one or more functions to assist with the "
            "user query.\n\nYou are provided with function signatures within <tools></tools> "
            f"XML tags:\n<tools>\n{tools}\n</tools>\n\nFor each function call, return a json "
            "object with function name and arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>")


def render(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    """Qwen3 ChatML text of a conversation; tool messages go in as user <tool_response> blocks,
    consecutive ones sharing a block (as Qwen3's own template does)."""
    parts: list[str] = []
    for i, msg in enumerate(messages):
        content = msg.content or ""
        if msg.role == "tool":
            if i == 0 or messages[i - 1].role != "tool":
                parts.append(f"{IM_START}user")
            parts.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i == len(messages) - 1 or messages[i + 1].role != "tool":
                parts.append(f"{IM_END}\n")
        else:
            parts.append(f"{IM_START}{msg.role}\n{content}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


#: Jinja twin of ``render`` (tests check they agree).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class TurnKind(str, Enum):
    """What an assistant turn asks for."""

    call = "call"            # exactly one well-formed <tool_call>
    final = "final"          # no tool call: the final answer
    malformed = "malformed"  # unparseable or several tool calls


@dataclass(frozen=True)
class AssistantTurn:
    """One assistant turn, read with the judge's parser."""

    kind: TurnKind
    call: MetaToolCall | None
    text: str
    problem: str = ""


def parse_assistant(text: str) -> AssistantTurn:
    turn = parse_turn(Message(role="assistant", content=text))
    if turn.malformed:
        return AssistantTurn(TurnKind.malformed, None, turn.text, turn.malformed[0])
    if len(turn.calls) > 1:
        return AssistantTurn(TurnKind.malformed, None, turn.text,
                             f"{len(turn.calls)} tool calls in one turn; make exactly one")
    if turn.calls:
        return AssistantTurn(TurnKind.call, turn.calls[0], turn.text)
    return AssistantTurn(TurnKind.final, None, turn.text)


def tool_call_text(name: str, arguments: dict[str, Any], think: str) -> str:
    """An assistant turn making one call (what a well-behaved agent writes)."""
    call = json.dumps({"name": name, "arguments": arguments})
    return f"<think>\n{think}\n</think>\n\n<tool_call>\n{call}\n</tool_call>"


def call_tool_text(tool: str, arguments: dict[str, Any], think: str, as_object: bool = False) -> str:
    """A call_tool turn; ``as_object``: the tool's arguments as a JSON object rather than the
    JSON string the meta-tool declares (the loop and the format rules accept both)."""
    return tool_call_text(CALL_TOOL, {"tool_name": tool, "arguments": arguments if as_object
                                      else json.dumps(arguments)}, think)


def final_text(answer: str, think: str) -> str:
    return f"<think>\n{think}\n</think>\n\n{answer}"


def tool_content(ok: bool, result: Any = None, error: dict[str, Any] | None = None,
                 status: int | None = None, max_chars: int = 8000) -> str:
    """A tool message's content: the farm's answer as JSON, a huge result cut to ``max_chars``
    (kept valid JSON: the cut text becomes a string with a note)."""
    body: dict[str, Any] = {"ok": ok}
    if ok:
        body["result"] = result
    else:
        body["error"] = error or {}
        if status is not None:
            body["status"] = status
    text = json.dumps(body, default=str)
    if len(text) > max_chars and ok:
        cut = json.dumps(result, default=str)[:max_chars]
        text = json.dumps({"ok": True, "result": cut,
                           "note": f"result truncated to {max_chars} characters"})
    return text
