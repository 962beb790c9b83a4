"""The LLM pass over candidate edges: batches of edges in, keep/reject with a reason out.

Any OpenAI-compatible endpoint through ``envfarm.llm.LLMClient``. Obvious variants of the answer
(a bare list, ``"keep": "true"``, an integer id, ``src`` as ``tool.field``) are coerced and counted;
an answer that is unparseable or leaves edges without a usable ruling is asked once more with what
was wrong; entries naming unknown edges or tools are counted and ignored. An edge the LLM never ruled on
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
    malformed: int = 0           # batches without one usable ruling (after the repair)
    coerced: int = 0             # rulings read from an obvious variant ("true", 12, "tool.field")
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
    """Rulings of one batch: one question, then one repair asking again with what was wrong
    (unparseable, or edges left without a usable ruling); the rulings of both are merged."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": batch_prompt(nodes, batch)}]
    rulings: dict[str, tuple[bool, str]] = {}
    for attempt in range(2):
        try:
            res = await llm.chat(messages, stage=STAGE, scenario=env, response_format={"type": "json_object"},
                                 temperature=0.0, salt=f"retry{attempt}" if attempt else None)
        except LLMError:
            stats.llm_errors += 1
            return rulings
        stats.calls += 1
        stats.prompt_tokens += res.usage.prompt_tokens
        stats.completion_tokens += res.usage.completion_tokens
        stats.cost_usd += res.usage.cost_usd
        try:
            found, problems = _rulings(res.text, dict(batch), stats)
        except ParseError as exc:
            found, problems = {}, [str(exc)]
        rulings = {**found, **rulings}  # a ruling already made stands
        missing = [eid for eid, _ in batch if eid not in rulings]
        if not missing:
            return rulings
        if attempt == 0:
            stats.retried += 1
            problems.append(f"no usable ruling for {', '.join(missing)}")
            messages += [{"role": "assistant", "content": res.text[:4000]},
                         {"role": "user", "content": "Your answer could not be used: " + "; ".join(problems)[:1500]
                          + '. Answer again with one JSON object {"edges": [...]}, one entry per edge id, '
                          '"keep" true or false.'}]
    if not rulings:
        stats.malformed += 1  # two answers and not one usable ruling: counted, never silently 0 edges
    return rulings


_TRUE, _FALSE = {"true", "yes", "keep", "1", "y"}, {"false", "no", "reject", "0", "n"}


def _coerce_keep(value: Any) -> bool | None:
    """``true`` and its obvious variants ("true", "yes", 1); None when it is no ruling."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return None


def _entries(text: str) -> list[Any]:
    """The list of rulings: ``{"edges": [...]}``, or a bare list (fenced or not)."""
    try:
        value: Any = extract_json(text)
    except ParseError:
        body = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            raise ParseError("no JSON object or list found") from None
    if isinstance(value, dict):
        value = value.get("edges", next((v for v in value.values() if isinstance(v, list)), None))
    if not isinstance(value, list):
        raise ParseError('"edges" must be a list of objects')
    return value


def _rulings(text: str, batch: dict[str, Edge], stats: ConfirmStats) -> tuple[dict[str, tuple[bool, str]], list[str]]:
    """(edge id -> (keep, reason), what could not be used). Obvious variants are coerced and
    counted: an integer id, ``"keep": "true"``, ``src`` written as ``tool.field``."""
    out: dict[str, tuple[bool, str]] = {}
    problems: list[str] = []
    for entry in _entries(text):
        if not isinstance(entry, dict):
            problems.append(f"entry {json.dumps(entry)[:40]} is not an object")
            continue
        raw_id = entry.get("id")
        eid = f"e{raw_id}" if isinstance(raw_id, int) or (isinstance(raw_id, str) and raw_id.isdigit()) else str(raw_id)
        edge = batch.get(eid)
        if edge is None:
            stats.unknown_edge += 1
            problems.append(f"unknown edge id {raw_id!r}")
            continue
        src, dst = (str(v).split(".", 1)[0] if v is not None else None for v in (entry.get("src"), entry.get("dst")))
        if src not in (None, edge.src) or dst not in (None, edge.dst):
            stats.unknown_tool += 1  # a tool the env lacks, or not this edge's: the entry is not trusted
            problems.append(f"{eid} names {src} -> {dst}, not {edge.src} -> {edge.dst}")
            continue
        keep = _coerce_keep(entry.get("keep"))
        if keep is None:
            problems.append(f"{eid}: keep must be true or false, got {entry.get('keep')!r}")
            continue
        stats.coerced += (eid != raw_id or keep is not entry.get("keep") or src != entry.get("src")
                          or dst != entry.get("dst"))
        out[eid] = (keep, str(entry.get("reason") or "")[:300])
    return out, problems


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
