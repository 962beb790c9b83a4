"""Format validation of a trajectory: the six rules of the AWM paper (appendix A.4).

1. every assistant turn carries non-empty ``<think>`` reasoning;
2. ``call_tool`` names a tool that ``list_tools`` returned;
3. arguments are valid JSON and conform to the tool's schema;
4. ``list_tools`` is called exactly once, and first;
5. with more than one turn, at least one call beyond ``list_tools`` succeeds (so ``list_tools``
   then a refusal is a format error, as the paper penalizes refusals);
6. a server error in a tool result is the environment's fault, not a format error.

The first violating step is reported; a violation ends the episode with reward −1.0, an
environment error makes it invalid.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict, Field

from envfarm.verdict import Outcome, Verdict
from judge.trajectory import (
    CALL_TOOL,
    LIST_TOOLS,
    MetaToolCall,
    ToolSchema,
    Trajectory,
    listed_tools,
    parse_turn,
    tool_result,
)


class FormatRule(str, Enum):
    """Which rule a step broke."""

    reasoning = "reasoning"                  # 1
    known_tool = "known_tool"                # 2
    valid_arguments = "valid_arguments"      # 3
    list_tools_first = "list_tools_first"    # 4
    successful_call = "successful_call"      # 5
    environment_error = "environment_error"  # 6 (not the agent's fault)


class FormatReport(BaseModel):
    """The first violation in a trajectory, or ok."""

    model_config = ConfigDict(extra="forbid")

    ok: bool = Field(description="no rule broken and no environment error")
    rule: FormatRule | None = Field(default=None, description="the rule broken first")
    step: int | None = Field(default=None, description="index of the message in `messages`")
    turn: int | None = Field(default=None, description="index of the assistant turn (0-based)")
    message: str = Field(default="", description="what is wrong")

    @property
    def environment_error(self) -> bool:
        return self.rule is FormatRule.environment_error

    def to_verdict(self) -> Verdict | None:
        """The verdict this report forces, or None when the trajectory is well formed."""
        if self.ok:
            return None
        details = {"format": self.model_dump(mode="json")}
        if self.environment_error:
            return Verdict.of(Outcome.environment_error, self.message, error_kind="env_error",
                              details=details)
        return Verdict.of(Outcome.format_error, f"rule {self.rule.value}: {self.message}",
                          details=details)


class _Violation(Exception):
    def __init__(self, rule: FormatRule, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message


def check_format(trajectory: Trajectory) -> FormatReport:
    """Apply the six rules in order of the conversation; report the first violation."""
    checker = FormatChecker(trajectory.tools)
    for msg in trajectory.messages:
        checker.add(msg)
    return checker.report()


class FormatChecker:
    """``check_format`` a message at a time, for a trajectory that grows (a trainer checks after
    every turn): ``add`` each new message, ``report`` whenever; each message is read once, so
    a whole episode costs O(messages) where checking every prefix anew cost O(messages²)."""

    def __init__(self, tools: list[ToolSchema] | None = None) -> None:
        #: The trajectory's copy of the tools (schemas a list_tools answer may omit).
        self.tools = tools
        self.step = -1
        self.turn = -1
        self.last_assistant: int | None = None
        self.listed: dict[str, ToolSchema] | None = None
        self.list_tools_calls = 0
        self.any_call = False
        self.successes = 0
        self.pending: list[MetaToolCall] = []
        self.violation: FormatReport | None = None  # the first one; later messages are not read

    def add(self, msg: Any) -> None:
        if self.violation is not None:
            return
        self.step += 1
        try:
            if msg.role == "assistant":
                self.turn += 1
                self.last_assistant = self.step
                self._assistant(msg)
            elif msg.role == "tool":
                self._tool(msg)
        except _Violation as v:
            self.violation = self._report(v.rule, v.message, self.step)

    def report(self) -> FormatReport:
        """The first violation in the messages so far, or ok."""
        if self.violation is not None:
            return self.violation
        end = self.last_assistant or 0
        if self.turn < 0:
            return self._report(FormatRule.list_tools_first, "the agent never spoke",
                                max(self.step, 0))
        if self.list_tools_calls == 0:
            return self._report(FormatRule.list_tools_first, "list_tools was never called", end)
        if self.turn + 1 > 1 and self.successes == 0:
            return self._report(FormatRule.successful_call,
                                f"{self.turn + 1} turns and no successful tool call", end)
        return FormatReport(ok=True)

    def _report(self, rule: FormatRule, message: str, step: int) -> FormatReport:
        return FormatReport(ok=False, rule=rule, step=step, turn=self.turn, message=message)

    def _assistant(self, msg: Any) -> None:
        turn = parse_turn(msg)
        if not (turn.think and turn.think.strip()):
            raise _Violation(FormatRule.reasoning, "assistant turn without <think> reasoning")
        if turn.malformed:
            raise _Violation(FormatRule.valid_arguments, turn.malformed[0])
        self.pending = []
        for call in turn.calls:
            if call.name == LIST_TOOLS:
                if self.list_tools_calls or self.any_call:
                    raise _Violation(FormatRule.list_tools_first,
                                     "list_tools must be called exactly once, first")
                self.list_tools_calls += 1
            elif call.name == CALL_TOOL:
                if not self.list_tools_calls:
                    raise _Violation(FormatRule.list_tools_first,
                                     "call_tool before list_tools")
                self._call_tool(call)
            else:
                raise _Violation(FormatRule.known_tool,
                                 f"{call.name!r} is not a meta-tool (list_tools / call_tool)")
            self.any_call = True
            self.pending.append(call)

    def _call_tool(self, call: MetaToolCall) -> None:
        name = call.arguments.get("tool_name")
        if not isinstance(name, str) or not name:
            raise _Violation(FormatRule.valid_arguments, "call_tool needs a string 'tool_name'")
        raw = call.arguments.get("arguments", "{}")
        if isinstance(raw, str):
            try:
                args = json.loads(raw) if raw.strip() else {}
            except ValueError as exc:
                raise _Violation(FormatRule.valid_arguments,
                                 f"arguments of {name} are not valid JSON: {exc}") from None
        else:
            args = raw
        if not isinstance(args, dict):
            raise _Violation(FormatRule.valid_arguments,
                             f"arguments of {name} must be a JSON object")
        if self.listed is None:
            # list_tools answered something that is not a tool list, and the trajectory has no
            # copy: no name can be checked, so nothing the agent calls passes as known. Not the
            # agent's fault either: the environment's answer is unusable (rule 6).
            raise _Violation(FormatRule.environment_error,
                             f"call_tool({name!r}) after a list_tools answer that is not a "
                             "tool list: tool names cannot be checked")
        tool = self.listed.get(name)
        if tool is None:
            raise _Violation(FormatRule.known_tool, f"{name!r} is not a tool list_tools returned")
        if tool.input_schema:
            try:
                validator = jsonschema.validators.validator_for(tool.input_schema)
                validator(tool.input_schema).validate(args)
            except jsonschema.ValidationError as exc:
                where = "/".join(str(p) for p in exc.absolute_path) or "arguments"
                raise _Violation(FormatRule.valid_arguments,
                                 f"arguments of {name} fail its schema at {where}: "
                                 f"{exc.message}") from None
            except jsonschema.SchemaError:
                pass  # the environment's schema is broken: not the agent's fault

    def _tool(self, msg: Any) -> None:
        call = self.pending.pop(0) if self.pending else None
        ok, kind, payload = tool_result(msg)
        if kind == "env_error":
            raise _Violation(FormatRule.environment_error,
                             f"server error in a tool result: {str(payload)[:300]}")
        if call is None:
            return
        if call.name == LIST_TOOLS:
            tools = listed_tools(payload) if ok else None
            if tools is None and self.tools:
                tools = self.tools
            # An empty list is a list: every call_tool after it names an unknown tool.
            self.listed = {tool.name: tool for tool in tools} if tools is not None else None
            if self.listed and self.tools:
                # list_tools' answer may omit schemas; the trajectory's copy has them
                for schema in self.tools:
                    known = self.listed.get(schema.name)
                    if known is not None and not known.input_schema:
                        self.listed[schema.name] = schema
        elif ok:
            self.successes += 1
