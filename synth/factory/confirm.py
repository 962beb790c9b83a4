"""The LLM pass over candidate edges: batches of edges in, keep/reject with a reason out.

Any OpenAI-compatible endpoint through ``envfarm.llm.LLMClient``. A malformed answer is asked once
more; answers naming unknown edges or tools are counted and ignored. An edge the LLM never ruled on
stays unconfirmed (not kept, ``reason`` says why). Nothing here raises for a bad answer.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from envfarm.errors import LLMError
from synth._parse import ParseError, extract_json
from synth.factory.model import Edge, Node

STAGE = "graph"

SYSTEM = """You check a tool dependency graph of one API. An edge "A.field -> B.param" claims that the \
value of `field` in A's JSON response is a correct value to pass as B's required input `param` (the same \
entity or the same identifier), so a user's task can call A first and then B with that value.
Keep an edge only when that is true. Reject it when the field is a different entity or kind of value, \
or when the parameter is something the user states (a free-text name, a reason, a new date) rather than \
something an earlier call returns.
Answer with one JSON object: {"edges": [{"id": "<edge id>", "src": "<A>", "dst": "<B>", \
"keep": true|false, "reason": "<one short sentence>"}]} with one entry per edge id given."""


@dataclass
class ConfirmStats:
    """What the LLM pass did, for the graph's stats and ``synth report``."""

    batches: int = 0
    calls: int = 0
    retried: int = 0
    malformed: int = 0           # answers that were not the JSON asked for (after the retry)
    llm_errors: int = 0          # the endpoint failed (after the client's own retries)
    unknown_edge: int = 0        # entries naming an edge id not in the batch
    unknown_tool: int = 0        # entries whose src/dst is not the edge's tools
    unconfirmed: int = 0         # edges no valid entry ruled on
    kept: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def batch_prompt(nodes: dict[str, Node], batch: list[tuple[str, Edge]]) -> str:
    """The user message for one batch: the tools involved, then the edges with their ids."""
    tools = sorted({t for _, e in batch for t in (e.src, e.dst)})
    lines = ["Tools:"]
    for name in tools:
        node = nodes.get(name)
        lines.append(f"- {name}: {(node.description if node else '').strip()[:300]}")
    lines.append("\nEdges:")
    for eid, e in batch:
        param = next((p for p in nodes[e.dst].params if p.name == e.param), None) if e.dst in nodes else None
        field = next((f for f in nodes[e.src].fields if f.path == e.field), None) if e.src in nodes else None
        lines.append(f"{eid}: {e.src}.{e.field} ({field.type if field else '?'}) -> {e.dst}.{e.param} "
                     f"({param.type if param else '?'}{': ' + param.description[:160] if param and param.description else ''})")
    return "\n".join(lines)


async def confirm_edges(llm: Any, env: str, nodes: list[Node], edges: list[Edge], *,
                        batch_size: int = 20) -> ConfirmStats:
    """Rule on ``edges`` in place (``kept``, ``reason``, ``source = "llm"`` once ruled)."""
    stats = ConfirmStats()
    by_name = {n.tool: n for n in nodes}
    for start in range(0, len(edges), batch_size):
        batch = [(f"e{start + i}", e) for i, e in enumerate(edges[start:start + batch_size])]
        stats.batches += 1
        rulings = await _ask(llm, env, by_name, batch, stats)
        for eid, edge in batch:
            edge.found_by = edge.found_by or edge.source
            ruling = rulings.get(eid)
            if ruling is None:
                edge.kept, edge.reason = False, "unconfirmed: the LLM gave no valid ruling"
                stats.unconfirmed += 1
                continue
            edge.kept, edge.reason, edge.source = ruling[0], ruling[1], "llm"
            stats.kept += edge.kept
            stats.rejected += not edge.kept
    return stats


async def _ask(llm: Any, env: str, nodes: dict[str, Node], batch: list[tuple[str, Edge]],
               stats: ConfirmStats) -> dict[str, tuple[bool, str]]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": batch_prompt(nodes, batch)}]
    for attempt in range(2):
        try:
            res = await llm.chat(messages, stage=STAGE, scenario=env, response_format={"type": "json_object"},
                                 temperature=0.0, salt=f"retry{attempt}" if attempt else None)
        except LLMError:
            stats.llm_errors += 1
            return {}
        stats.calls += 1
        stats.prompt_tokens += res.usage.prompt_tokens
        stats.completion_tokens += res.usage.completion_tokens
        stats.cost_usd += res.usage.cost_usd
        try:
            return _rulings(res.text, dict(batch), stats)
        except ParseError:
            if attempt == 0:
                stats.retried += 1
    stats.malformed += 1
    return {}


def _rulings(text: str, batch: dict[str, Edge], stats: ConfirmStats) -> dict[str, tuple[bool, str]]:
    entries = extract_json(text).get("edges")
    if not isinstance(entries, list) or not all(isinstance(x, dict) for x in entries):
        raise ParseError('"edges" must be a list of objects')
    out: dict[str, tuple[bool, str]] = {}
    for entry in entries:
        edge = batch.get(str(entry.get("id")))
        if edge is None:
            stats.unknown_edge += 1
            continue
        if entry.get("src") not in (None, edge.src) or entry.get("dst") not in (None, edge.dst):
            stats.unknown_tool += 1  # a tool the env lacks, or not this edge's: the entry is not trusted
            continue
        keep = entry.get("keep")
        if not isinstance(keep, bool):
            continue  # no ruling: the edge stays unconfirmed
        out[str(entry["id"])] = (keep, str(entry.get("reason") or "")[:300])
    return out


def replay_answer(batch_prompt_text: str, judge: Any) -> str:
    """An answer to ``batch_prompt_text`` made by ``judge(src, field, dst, param) -> (keep, reason)``,
    for recording offline replays (benchmarks)."""
    edges = []
    for line in batch_prompt_text.split("\nEdges:\n", 1)[-1].splitlines():
        eid, _, rest = line.partition(": ")
        src_part, _, dst_part = rest.partition(" -> ")
        src, _, field = src_part.split(" ", 1)[0].partition(".")
        dst, _, param = dst_part.split(" ", 1)[0].partition(".")
        keep, reason = judge(src, field, dst, param)
        edges.append({"id": eid, "src": src, "dst": dst, "keep": keep, "reason": reason})
    return json.dumps({"edges": edges})
