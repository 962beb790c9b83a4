"""The agent trajectory the judge reads, in the Qwen3 chat format.

Assistant turns are ``<think>…</think>`` followed by ``<tool_call>{"name", "arguments"}</tool_call>``
blocks (or a final answer). The agent sees two meta-tools: ``list_tools`` and
``call_tool(tool_name, arguments: JSON string)``; tool results come back as role ``tool``
messages, whose content is the farm's call answer ``{"ok", "result"}`` / ``{"ok": false,
"error": {"kind", "message"}}`` as JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

LIST_TOOLS = "list_tools"
CALL_TOOL = "call_tool"

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolSchema(BaseModel):
    """One real tool of the environment (what ``list_tools`` returns)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="tool name (the FastAPI operation_id)")
    description: str = Field(default="", description="what the tool does")
    input_schema: dict[str, Any] = Field(default_factory=dict,
                                         description="JSON schema of the arguments")


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"] = Field(description="who speaks")
    content: str | None = Field(default="", description="text (Qwen3 tags inline)")
    reasoning_content: str | None = Field(
        default=None, description="reasoning some servers split out of <think>")
    name: str | None = Field(default=None, description="tool name of a tool message")
    tool_call_id: str | None = Field(default=None, description="id of the answered call")


class Trajectory(BaseModel):
    """One recorded episode: the task, the conversation, the final answer, the tools."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(description="the user's task, as given to the agent")
    messages: list[Message] = Field(description="the whole conversation, in order")
    final_answer: str | None = Field(default=None,
                                     description="the agent's last answer (default: last turn)")
    tools: list[ToolSchema] = Field(default_factory=list,
                                    description="the environment's real tools (schemas)")
    scenario: str | None = Field(default=None, description="AWM scenario name")
    task_idx: int | None = Field(default=None, description="index of the task in the scenario")
    max_turns: int | None = Field(default=None, ge=1,
                                  description="the execution budget: assistant turns allowed")

    def answer(self) -> str | None:
        """The final answer: the explicit one, else the last assistant text without a call."""
        if self.final_answer is not None:
            return self.final_answer
        for msg in reversed(self.messages):
            if msg.role == "assistant":
                turn = parse_turn(msg)
                return None if turn.calls or turn.malformed else turn.text
        return None


class MetaToolCall(BaseModel):
    """One ``<tool_call>`` block, parsed: the agent's call of a meta-tool (``list_tools`` or
    ``call_tool``); the env tool that ``call_tool`` names is called as ``envfarm.models.ToolCall``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="meta-tool name: list_tools or call_tool")
    arguments: dict[str, Any] = Field(default_factory=dict, description="its arguments")


class Turn(BaseModel):
    """An assistant message split into reasoning, calls and remaining text."""

    model_config = ConfigDict(extra="forbid")

    think: str | None = Field(description="the <think> content; None when there is none")
    calls: list[MetaToolCall] = Field(description="parsed tool calls")
    malformed: list[str] = Field(description="why each unparseable <tool_call> failed")
    text: str = Field(description="what is left: the answer of a final turn")


def parse_turn(msg: Message) -> Turn:
    content = msg.content or ""
    thinks = _THINK.findall(content)
    think = "\n".join(thinks) if thinks else None
    if msg.reasoning_content is not None:
        think = (msg.reasoning_content + "\n" + (think or "")).strip()
    elif think is None and "</think>" in content:
        # Qwen3 templates often open <think> in the prompt; only the closing tag is generated.
        think = content.split("</think>", 1)[0]
    rest = _THINK.sub("", content)
    if "</think>" in rest:
        rest = rest.split("</think>", 1)[1]
    calls: list[MetaToolCall] = []
    malformed: list[str] = []
    for block in _TOOL_CALL.findall(rest):
        try:
            data = json.loads(block)
        except ValueError as exc:
            malformed.append(f"<tool_call> is not valid JSON: {exc}")
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            malformed.append("<tool_call> needs a JSON object with a string 'name'")
            continue
        args = data.get("arguments", {})
        if isinstance(args, str):  # some agents double-encode; accept it if it parses
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as exc:
                malformed.append(f"arguments of {data['name']} are not valid JSON: {exc}")
                continue
        if not isinstance(args, dict):
            malformed.append(f"arguments of {data['name']} must be a JSON object")
            continue
        calls.append(MetaToolCall(name=data["name"], arguments=args))
    if "<tool_call>" in rest and rest.count("<tool_call>") != rest.count("</tool_call>"):
        malformed.append("unterminated <tool_call>")
    text = _TOOL_CALL.sub("", rest).replace("<tool_call>", "").strip()
    return Turn(think=think, calls=calls, malformed=malformed, text=text)


def tool_result(msg: Message) -> tuple[bool, str | None, Any]:
    """(ok, error kind, payload) of a tool message.

    Failures are read in every shape the farm sends them: its call answer (``{"ok": false,
    "error": {kind, message}}``), its error body (``{"error": {...}}``), an MCP result
    (``isError``) and MCP's plain text (``"env_error: ..."``). Only an ``agent_error`` is the
    agent's fault; a failure of any other kind, or of none, is the environment's. Content that is
    none of these is a successful result.
    """
    text = msg.content or ""
    try:
        data = json.loads(text)
    except ValueError:
        said = _said_kind(text)
        return (True, None, msg.content) if said is None else (False, said[0], said[1])
    if not isinstance(data, dict):
        return True, None, data
    if "ok" in data:  # the farm's call answer
        if data.get("ok"):
            return True, None, data.get("result")
        error = data.get("error") if isinstance(data.get("error"), dict) else {}
        status = data.get("status")
        kind = error.get("kind")
        if isinstance(status, int) and status >= 500:
            kind = "env_error"
        return False, _blame(kind), error.get("message")
    if data.get("isError") is True or data.get("is_error") is True:  # an MCP tool result
        words = " ".join(str(c.get("text", "")) for c in data.get("content") or []
                         if isinstance(c, dict))
        said = _said_kind(words)
        return False, said[0] if said else "env_error", said[1] if said else words
    error = data.get("error")
    if set(data) == {"error"} and isinstance(error, dict) and "message" in error:
        return False, _blame(error.get("kind")), error.get("message")  # the farm's error body
    return True, None, data


_KIND_PREFIX = re.compile(r"^\s*(agent_error|env_error)\s*:\s*", re.IGNORECASE)


def _said_kind(text: str) -> tuple[str, str] | None:
    """``("env_error", rest)`` for text like ``env_error: boom`` (how MCP carries our errors)."""
    match = _KIND_PREFIX.match(text)
    return (match.group(1).lower(), text[match.end():]) if match else None


def _blame(kind: object) -> str:
    # Only the agent's own mistakes score 0; anything else the farm reports is not the agent's.
    return "agent_error" if kind == "agent_error" else "env_error"


def listed_tools(payload: Any) -> list[ToolSchema] | None:
    """Tool schemas out of a list_tools result (a list, or ``{"tools": [...]}``)."""
    if isinstance(payload, dict):
        payload = payload.get("tools")
    if not isinstance(payload, list):
        return None
    tools = []
    for item in payload:
        if isinstance(item, str):
            tools.append(ToolSchema(name=item))
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            schema = item.get("input_schema") or item.get("inputSchema") or item.get(
                "parameters") or {}
            tools.append(ToolSchema(name=item["name"], description=str(item.get(
                "description") or ""), input_schema=schema if isinstance(schema, dict) else {}))
    return tools
