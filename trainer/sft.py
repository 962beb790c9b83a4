"""EnvFactory episodes as SFT conversations in the agent loop's Qwen3 format (``trainer.format``).

Each accepted episode becomes what a well-behaved agent would have written on that task: the
system prompt with the meta-tools, the user's request, a ``list_tools`` call answered with the
env's tools, one ``call_tool`` per recorded call answered with the recorded result (follow-up
user messages between the shares of calls they ask for), and the final answer. ``FORMATS`` is
what ``envfarm synth export`` gets of the trainer (synth sits below the trainer and cannot
import it: the command line hands it in).
"""

from __future__ import annotations

from typing import Any

from envfarm.models import ToolSpec
from judge import Message
from judge.trajectory import LIST_TOOLS
from synth.factory.export import SftFormat, turns
from synth.factory.model import Episode
from trainer.format import (
    call_tool_text,
    final_text,
    render,
    system_prompt,
    tool_call_text,
    tool_content,
)

FORMAT = "qwen3"


def qwen3_messages(episode: Episode, tools: list[ToolSpec]) -> list[Message]:
    msgs = [Message(role="system", content=system_prompt())]
    listed = False
    for text, idx in turns(episode):
        msgs.append(Message(role="user", content=text))
        if not listed:  # the agent lists the tools exactly once, first
            msgs.append(Message(role="assistant", content=tool_call_text(
                LIST_TOOLS, {}, "First I list the tools I can use.")))
            msgs.append(Message(role="tool", content=tool_content(
                True, [t.model_dump() for t in tools], max_chars=1 << 30)))
            listed = True
        for i in idx:
            call = episode.calls[i]
            msgs.append(Message(role="assistant", content=call_tool_text(
                call.tool, call.arguments, f"Next I call {call.tool}.")))
            msgs.append(Message(role="tool", content=tool_content(True, call.result)))
        if idx and idx[-1] != len(episode.calls) - 1:
            msgs.append(Message(role="assistant", content=final_text("Done. What next?", "This part is done.")))
    msgs.append(Message(role="assistant", content=final_text(episode.final_answer or "Done.",
                                                             "The task is complete.")))
    return msgs


def qwen3_record(episode: Episode, task: str, tools: list[ToolSpec]) -> dict[str, Any]:
    """``messages`` (role/content, Qwen3 tags inline) and the rendered ``text`` the trainer trains on."""
    msgs = qwen3_messages(episode, tools)
    return {"env": episode.env, "chain_id": episode.chain_id, "task": task,
            "messages": [m.model_dump() for m in msgs], "text": render(msgs, add_generation_prompt=False)}


#: The trainer's SFT formats, by name.
FORMATS: dict[str, SftFormat] = {FORMAT: qwen3_record}
