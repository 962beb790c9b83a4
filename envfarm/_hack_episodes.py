"""The episodes the hack probes play (``envfarm.hackprobes``), on a runtime's own instances.

Each episode is a list of tool calls run on a fresh instance of the task's starting database,
the database it left, and a trajectory in the Qwen3 format the judge reads (``list_tools``
first, reasoning in every turn, every call and its answer), so the LLM-judge path sees a probe
exactly as it sees an agent.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from envfarm.check import probe_arguments, spec_endpoints
from envfarm.dbrows import changed_rows, delete_row, table_rows
from envfarm.models import CallResult, ToolCall, ToolSpec
from envfarm.runtime import EnvRuntime

#: most values a dump answer lists, and its most characters (the sandbox takes 1 MiB requests)
DUMP_VALUES = 2_000
DUMP_CHARS = 60_000
#: write calls tried, at most, to find one that touches nothing the reference touched
WRITE_TRIES = 40
_METHOD_ORDER = {"DELETE": 0, "PATCH": 1, "PUT": 1, "POST": 2}


@dataclass
class Episode:
    """What one probe did: each call and its answer, and the database it left."""

    calls: list[tuple[ToolCall, CallResult]] = field(default_factory=list)
    final: bytes = b""
    note: str = ""

    @property
    def failed(self) -> list[str]:
        return [f"{c.tool}: {r.error.message if r.error else '?'}" for c, r in self.calls if not r.ok]


class EnvKit:
    """What the probes need of one runtime, looked up once: which tools write, and their
    schema-valid example arguments."""

    def __init__(self, runtime: EnvRuntime) -> None:
        self.runtime = runtime
        self.endpoints = spec_endpoints(runtime.bundle.api_spec)
        self.tools: list[ToolSpec] = runtime.tools
        self._harmless: dict[bytes, ToolCall | None] = {}  # by the starting database's digest

    def writes(self, tool: str) -> bool:
        """The tool's HTTP method asks for a change (anything but GET/HEAD)."""
        op = self.runtime.operations.get(tool)
        return op is not None and op.method.upper() not in ("GET", "HEAD")

    def method(self, tool: str) -> str:
        op = self.runtime.operations.get(tool)
        return op.method.upper() if op is not None else ""

    def examples(self, tool: ToolSpec, limit: int) -> list[dict[str, Any]]:
        return probe_arguments(tool, self.endpoints.get(tool.name), limit)

    async def run(self, initial: bytes, calls: list[ToolCall]) -> Episode:
        """``calls`` in order on a fresh instance of ``initial`` (a failed call changes nothing)."""
        inst = self.runtime.instance(initial)
        try:
            done = [(call, await inst.call(call.tool, call.arguments)) for call in calls]
            return Episode(done, inst.snapshot())
        finally:
            inst.close()

    async def harmless(self, initial: bytes, avoid: set[str]) -> ToolCall | None:
        """A read that succeeds and changes nothing (a no-op agent's one call), preferring
        tools the reference does not use and tools without required arguments."""
        key = hashlib.sha256(initial).digest()
        if key in self._harmless:
            return self._harmless[key]
        reads = sorted((t for t in self.tools if not self.writes(t.name)),
                       key=lambda t: (t.name in avoid, len(t.input_schema.get("required", []))))
        found = None
        for tool in reads:
            for args in self.examples(tool, 2):
                episode = await self.run(initial, [ToolCall(tool=tool.name, arguments=args)])
                if episode.calls[0][1].ok and episode.final == initial:
                    found = ToolCall(tool=tool.name, arguments=args)
                    break
            if found:
                break
        self._harmless[key] = found
        return found

    async def dump(self, initial: bytes, solution: list[ToolCall]) -> tuple[Episode, list[str]]:
        """Every read tool with its example arguments (the reference's own reads first) on one
        instance, and every value they returned."""
        calls = [c for c in solution if not self.writes(c.tool)]
        calls += [ToolCall(tool=t.name, arguments=args) for t in self.tools if not self.writes(t.name)
                  for args in self.examples(t, 2)]
        episode = await self.run(initial, calls)
        values: dict[str, str] = {}
        for _, res in episode.calls:
            if res.ok:
                for value in scalars(res.result):
                    values.setdefault(value.lower(), value)
        return episode, list(values.values())[:DUMP_VALUES]

    async def side_effect(self, initial: bytes, ref: Episode) -> Episode | None:
        """The reference's episode ``ref``, then one write that touches no row the reference
        touched (a tool's, deletes first; else a row deleted from a table the reference left
        alone). None when the database has nothing else to touch."""
        touched = changed_rows(initial, ref.final)
        write = await self._unrelated_write(ref.final, touched)
        if write is not None:
            call, res, after, rows = write
            return Episode([*ref.calls, (call, res)], after,
                           f"then {call.tool}({json.dumps(call.arguments, default=str)}) "
                           f"changed {len(rows)} row(s) the task never touched")
        tables = {t for t, _ in touched}
        rows = table_rows(ref.final)
        spare = sorted((t for t in rows if t not in tables and rows[t]), key=lambda t: -len(rows[t]))
        if not spare:
            return None
        rowid = max(rows[spare[0]])
        return Episode(ref.calls, delete_row(ref.final, spare[0], rowid),
                       f"no tool made an unrelated write: {spare[0]} row {rowid} deleted directly")

    async def _unrelated_write(self, start: bytes, touched: set[tuple[str, int]]
                               ) -> tuple[ToolCall, CallResult, bytes, set] | None:
        writers = sorted((t for t in self.tools if self.writes(t.name)),
                         key=lambda t: _METHOD_ORDER.get(self.method(t.name), 3))
        tries, adder = 0, None
        for tool in writers:
            for args in self.examples(tool, 6):
                if tries >= WRITE_TRIES:
                    return adder
                tries += 1
                call = ToolCall(tool=tool.name, arguments=args)
                episode = await self.run(start, [call])
                res = episode.calls[0][1]
                rows = changed_rows(start, episode.final) if res.ok else set()
                if not rows or rows & touched:
                    continue
                before = table_rows(start)
                if any(rowid in before.get(table, {}) for table, rowid in rows):
                    return call, res, episode.final, rows  # deleted or changed an existing row
                adder = adder or (call, res, episode.final, rows)
        return adder


def last_write_removed(kit: EnvKit, solution: list[ToolCall]) -> list[ToolCall] | None:
    """The reference without its last writing call; None when it writes nothing."""
    writes = [i for i, call in enumerate(solution) if kit.writes(call.tool)]
    if not writes:
        return None
    return [call for i, call in enumerate(solution) if i != writes[-1]]


def scalars(value: Any) -> list[str]:
    """The text of every string and number in a tool's JSON answer, in order."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in scalars(v)]
    if isinstance(value, bool) or value is None:
        return []
    text = str(value).strip()
    return [text] if text and len(text) <= 200 else []


def dump_answer(values: list[str]) -> str:
    text = "Here is everything I found: " + "; ".join(values)
    return text[:DUMP_CHARS]


def _turn(think: str, body: str) -> dict[str, Any]:
    return {"role": "assistant", "content": f"<think>\n{think}\n</think>\n\n{body}"}


def _call_text(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def trajectory(task: str, tools: list[ToolSpec], episode: Episode, answer: str, *,
               scenario: str | None, task_idx: int | None) -> dict[str, Any]:
    """The episode as a ``judge.Trajectory`` (JSON): list_tools, one turn per call, the answer."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": task},
        _turn("I list the tools first.", _call_text("list_tools", {})),
        {"role": "tool", "name": "list_tools", "content": json.dumps(
            [{"name": t.name, "description": t.description} for t in tools])}]
    for call, res in episode.calls:
        messages.append(_turn(f"Next I call {call.tool}.", _call_text("call_tool", {
            "tool_name": call.tool, "arguments": json.dumps(call.arguments, default=str)})))
        body = {"ok": True, "result": res.result} if res.ok else {
            "ok": False, "error": res.error.model_dump() if res.error else {}}
        messages.append({"role": "tool", "name": "call_tool", "content": json.dumps(body, default=str)})
    messages.append(_turn("I have what I need.", answer))
    return {"task": task, "messages": messages, "final_answer": answer,
            "tools": [{"name": t.name, "description": t.description, "input_schema": t.input_schema}
                      for t in tools],
            "scenario": scenario, "task_idx": task_idx,
            "max_turns": sum(m["role"] == "assistant" for m in messages)}
