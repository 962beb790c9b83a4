"""EnvFactory's logical refinement of the tool graph (Section 3.3.1 step 2, 3.3.2): the LLM sees
the env's tools, prunes spurious candidate edges, **adds** the missing ones (naming the output field
that feeds the parameter, or a logical edge for a tool that takes or returns no data), and
classifies each required input parameter as internal (system state an earlier call returns) or
external (the user states it).

The env is split into chunks of *tools to decide* by what fits ``budget_chars``; every prompt still
lists every tool of the env with its inputs and output fields, so no edge's producer is hidden.
Any OpenAI-compatible endpoint through ``envfarm.llm.LLMClient``. Obvious answer variants (a bare
list, ``"keep": "true"``, an integer id, ``src`` as ``tool.field``, ``"Internal"``) are coerced and
counted; an answer that is unparseable or leaves something undecided is asked once more with what
was wrong. An edge no valid answer ruled on stays unconfirmed (not kept); a parameter the LLM did
not classify falls back to the name rule (``kind_source = "regex"``, counted). Nothing here
raises for a bad answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from envfarm.errors import LLMError
from synth._parse import ParseError, extract_json
from synth._usage import count_call
from synth.factory.candidates import is_identifier
from synth.factory.dbvalues import strict_id
from synth.factory.model import Edge, Node

STAGE = "graph"
DEFAULT_BUDGET_CHARS = 24_000  # ~6k tokens of prompt: the listing plus the tools decided in one call

SYSTEM = """You refine the tool dependency graph of one API. An edge "A.field -> B.param" says the value \
of `field` in A's JSON response is a correct value for B's required input `param` (the same entity or \
identifier), so a task can call A first and then B with that value.
For the tools you are asked to decide:
1. "edges": rule on every candidate edge id given: keep it only when that is true; reject it when the \
field is a different entity or kind of value, or when the parameter is something the user states.
2. "add": the missing edges INTO these tools: "src" any tool of the list, "field" exactly one of its \
output fields, "param" a required input of the destination. A tool that takes no input or returns no \
data still belongs to a workflow: link it with a logical edge ("field": "", "param": "") from the tool \
a task would call before it (list_notes -> delete_all_notes).
3. "params": classify every required input listed: "internal" when its value is system state an \
earlier call returns (an id, a code the system issued), "external" when a user states it (a name, a \
city, a date, an amount, free text).
Answer with one JSON object: {"edges": [{"id": "<edge id>", "keep": true|false, "reason": "<short>"}], \
"add": [{"src": "<tool>", "field": "<field or empty>", "dst": "<tool>", "param": "<param or empty>", \
"reason": "<short>"}], "params": [{"tool": "<tool>", "param": "<param>", "kind": "internal"|"external"}]}"""

_EDGE_LINE = re.compile(r"^(e\d+): ([^.\s]+)\.(\S*) \(.*?\) -> ([^.\s]+)\.(\S+)", re.MULTILINE)


@dataclass
class RefineStats:
    """What the LLM pass did, for the graph's stats and ``synth report``."""

    chunks: int = 0
    calls: int = 0
    retried: int = 0
    malformed: int = 0           # chunks without one usable answer (after the repair)
    coerced: int = 0             # entries read from an obvious variant ("true", 12, "tool.field")
    llm_errors: int = 0          # the endpoint failed (after the client's own retries)
    unknown_edge: int = 0        # rulings naming an edge id not in the chunk
    unknown_tool: int = 0        # entries naming a tool the env lacks (or not the edge's)
    unconfirmed: int = 0         # candidate edges no valid entry ruled on
    kept: int = 0
    rejected: int = 0
    added: int = 0               # edges the LLM added with a field
    added_logical: int = 0       # logical edges it added (a tool that takes or returns no data)
    add_invalid: int = 0         # additions naming a field or parameter the tools lack
    kinds_llm: int = 0           # required parameters the LLM classified
    kinds_fallback: int = 0      # ... it did not: classified by the name rule
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Chunk:
    """The tools one call decides, and the candidate edges into them (edge id -> edge)."""

    tools: list[str]
    edges: dict[str, Edge] = field(default_factory=dict)


@dataclass
class _Answer:
    rulings: dict[str, tuple[bool, str]] = field(default_factory=dict)
    added: dict[tuple[str, str, str, str], str] = field(default_factory=dict)
    kinds: dict[tuple[str, str], str] = field(default_factory=dict)


def regex_kind(param: str) -> str:
    """The name rule, the fallback when the LLM did not classify a parameter."""
    return "internal" if is_identifier(param) or strict_id(param) else "external"


def tools_listing(nodes: list[Node], *, descriptions: bool = True) -> str:
    lines = ["Tools of the API (inputs; -> output fields):"]
    for n in nodes:
        inputs = ", ".join(p.name + ("*" if p.required else "") for p in n.params)
        fields = ", ".join(f.path for f in n.fields) or "(no data)"
        desc = f": {_flat(n.description)[:150]}" if descriptions and n.description.strip() else ""
        lines.append(f"- {n.tool}({inputs}) -> {fields}{desc}")
    return "\n".join(lines) + "\n(* required)"


def _flat(text: str) -> str:
    return " ".join(text.replace("|", "/").split())


def _decide_block(node: Node, edges: dict[str, Edge], nodes: dict[str, Node]) -> str:
    lines = [f"## {node.tool}: {_flat(node.description)[:300]}"]
    required = [p for p in node.params if p.required]
    lines.append("inputs to classify: " + (" | ".join(
        f"{p.name} ({p.type}{': ' + _flat(p.description)[:120] if p.description else ''})" for p in required)
        or "(none)"))
    lines.append("candidate edges:" if edges else "candidate edges: (none)")
    for eid, e in edges.items():
        f = next((f for f in nodes[e.src].fields if f.path == e.field), None) if e.src in nodes else None
        p = next((p for p in node.params if p.name == e.param), None)
        lines.append(f"{eid}: {e.src}.{e.field} ({f.type if f else '?'}) -> {e.dst}.{e.param} ({p.type if p else '?'})")
    return "\n".join(lines)


def chunk_prompt(nodes: list[Node], chunk: Chunk, *, descriptions: bool = True) -> str:
    by_name = {n.tool: n for n in nodes}
    blocks = [_decide_block(by_name[t], {i: e for i, e in chunk.edges.items() if e.dst == t}, by_name)
              for t in chunk.tools]
    return (tools_listing(nodes, descriptions=descriptions) + "\n\nDecide for: " + ", ".join(chunk.tools)
            + "\n\n" + "\n\n".join(blocks))


def plan_chunks(nodes: list[Node], edges: list[Edge], budget_chars: int = DEFAULT_BUDGET_CHARS
                ) -> tuple[list[Chunk], bool]:
    """Tools to decide, grouped so that each prompt fits ``budget_chars`` (at least one tool per
    chunk), and whether the listing keeps descriptions (dropped when the listing alone would not fit:
    names, inputs and fields stay, so every producer is still visible)."""
    ids = {id(e): f"e{i}" for i, e in enumerate(edges)}
    descriptions = len(SYSTEM) + len(tools_listing(nodes)) <= budget_chars // 2
    base = len(SYSTEM) + len(tools_listing(nodes, descriptions=descriptions))
    by_name = {n.tool: n for n in nodes}
    chunks: list[Chunk] = []
    size = base
    for node in nodes:
        into = {ids[id(e)]: e for e in edges if e.dst == node.tool}
        cost = len(_decide_block(node, into, by_name)) + 2
        if not chunks or (chunks[-1].tools and size + cost > budget_chars):
            chunks.append(Chunk(tools=[]))
            size = base
        chunks[-1].tools.append(node.tool)
        chunks[-1].edges.update(into)
        size += cost
    return chunks, descriptions


async def refine_graph(llm: Any, env: str, nodes: list[Node], edges: list[Edge], *,
                       budget_chars: int = DEFAULT_BUDGET_CHARS) -> RefineStats:
    """Rule on ``edges`` in place, append the edges the LLM adds, classify every required parameter
    of ``nodes`` (``Param.kind``); the LLM's answers where usable, the name rule elsewhere."""
    stats = RefineStats()
    by_name = {n.tool: n for n in nodes}
    chunks, descriptions = plan_chunks(nodes, edges, budget_chars)
    known = {(e.src, e.field, e.dst, e.param): e for e in edges}
    for chunk in chunks:
        stats.chunks += 1
        answer = await _ask(llm, env, by_name, chunk, chunk_prompt(nodes, chunk, descriptions=descriptions), stats)
        for eid, edge in chunk.edges.items():
            edge.found_by = edge.found_by or edge.source
            ruling = answer.rulings.get(eid)
            if ruling is None:
                edge.kept, edge.reason = False, "unconfirmed: the LLM gave no valid ruling"
                stats.unconfirmed += 1
                continue
            edge.kept, edge.reason, edge.source = ruling[0], ruling[1], "llm"
            stats.kept += edge.kept
            stats.rejected += not edge.kept
        for key, reason in answer.added.items():
            if key in known:  # an addition that is a candidate the chunk did not rule on (or another chunk's)
                old = known[key]
                if not old.kept and old.reason.startswith("unconfirmed"):
                    old.kept, old.reason, old.source = True, reason, "llm"
                continue
            edge = Edge(src=key[0], field=key[1], dst=key[2], param=key[3], source="llm", found_by="llm",
                        kept=True, reason=reason)
            edges.append(edge)
            known[key] = edge
            stats.added_logical += not key[3]
            stats.added += bool(key[3])
        for tool in chunk.tools:
            for p in (p for p in by_name[tool].params if p.required):
                kind = answer.kinds.get((tool, p.name))
                p.kind, p.kind_source = (kind, "llm") if kind else (regex_kind(p.name), "regex")
                stats.kinds_llm += bool(kind)
                stats.kinds_fallback += not kind
    return stats


def classify_by_name(nodes: list[Node]) -> None:
    """Without an LLM: every required parameter by the name rule."""
    for n in nodes:
        for p in (p for p in n.params if p.required):
            p.kind, p.kind_source = regex_kind(p.name), "regex"


async def _ask(llm: Any, env: str, nodes: dict[str, Node], chunk: Chunk, prompt: str,
               stats: RefineStats) -> _Answer:
    """One question, then one repair asking again with what was wrong; usable parts of both merged
    (a ruling or classification already made stands)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    merged = _Answer()
    usable = False
    for attempt in range(2):
        try:
            res = await llm.chat(messages, stage=STAGE, scenario=env, response_format={"type": "json_object"},
                                 temperature=0.0, salt=f"retry{attempt}" if attempt else None)
        except LLMError:
            stats.llm_errors += 1  # counted as such, not as malformed; the rest falls back
            return merged
        count_call(stats, res)
        try:
            found, problems = _read(res.text, nodes, chunk, stats)
            usable = usable or bool(found.rulings or found.added or found.kinds)
        except ParseError as exc:
            found, problems = _Answer(), [str(exc)]
        merged.rulings = {**found.rulings, **merged.rulings}
        merged.kinds = {**found.kinds, **merged.kinds}
        merged.added = {**found.added, **merged.added}
        missing = [eid for eid in chunk.edges if eid not in merged.rulings]
        unclassified = [f"{t}.{p.name}" for t in chunk.tools for p in nodes[t].params
                        if p.required and (t, p.name) not in merged.kinds]
        if missing:
            problems.append(f"no usable ruling for {', '.join(missing)}")
        if unclassified:
            problems.append(f"no kind for {', '.join(unclassified)}")
        if not problems:
            break
        if attempt == 0:
            stats.retried += 1
            messages += [{"role": "assistant", "content": res.text[:4000]},
                         {"role": "user", "content": "Your answer could not be fully used: " + "; ".join(problems)[:1500]
                          + '. Answer again with one JSON object {"edges": [...], "add": [...], "params": [...]}.'}]
    if not usable:
        stats.malformed += 1  # not one usable entry: counted, never silently an empty graph
    return merged


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


def _object(text: str) -> dict[str, Any]:
    """The answer as ``{"edges", "add", "params"}``; a bare list (fenced or not) is the rulings."""
    try:
        return extract_json(text)
    except ParseError:
        body = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            raise ParseError("no JSON object found") from None
        if isinstance(value, list):
            return {"edges": value}
        raise ParseError("expected a JSON object") from None


def _entries(answer: dict[str, Any], key: str, problems: list[str]) -> list[dict[str, Any]]:
    value = answer.get(key, [])
    if not isinstance(value, list):
        problems.append(f'"{key}" must be a list of objects')
        return []
    bad = [v for v in value if not isinstance(v, dict)]
    if bad:
        problems.append(f'"{key}": entry {json.dumps(bad[0])[:40]} is not an object')
    return [v for v in value if isinstance(v, dict)]


def _read(text: str, nodes: dict[str, Node], chunk: Chunk, stats: RefineStats) -> tuple[_Answer, list[str]]:
    answer = _object(text)
    problems: list[str] = []
    out = _Answer()
    for entry in _entries(answer, "edges", problems):
        _read_ruling(entry, chunk, stats, out, problems)
    for entry in _entries(answer, "add", problems):
        _read_addition(entry, nodes, stats, out, problems)
    for entry in _entries(answer, "params", problems):
        tool, param = str(entry.get("tool", "")).split(".", 1)[0], str(entry.get("param", ""))
        kind = str(entry.get("kind", "")).strip().lower()
        if tool not in chunk.tools or not any(p.name == param and p.required for p in nodes[tool].params):
            problems.append(f"params: {tool}.{param} is not a required input of a tool to decide")
            continue
        if kind not in ("internal", "external"):
            problems.append(f"params: {tool}.{param}: kind must be internal or external, got {entry.get('kind')!r}")
            continue
        stats.coerced += kind != entry.get("kind")
        out.kinds[(tool, param)] = kind
    return out, problems


def _read_ruling(entry: dict[str, Any], chunk: Chunk, stats: RefineStats, out: _Answer, problems: list[str]) -> None:
    raw_id = entry.get("id")
    eid = f"e{raw_id}" if isinstance(raw_id, int) or (isinstance(raw_id, str) and raw_id.isdigit()) else str(raw_id)
    edge = chunk.edges.get(eid)
    if edge is None:
        stats.unknown_edge += 1
        problems.append(f"unknown edge id {raw_id!r}")
        return
    src, dst = (str(v).split(".", 1)[0] if v is not None else None for v in (entry.get("src"), entry.get("dst")))
    if src not in (None, edge.src) or dst not in (None, edge.dst):
        stats.unknown_tool += 1  # a tool the env lacks, or not this edge's: the entry is not trusted
        problems.append(f"{eid} names {src} -> {dst}, not {edge.src} -> {edge.dst}")
        return
    keep = _coerce_keep(entry.get("keep"))
    if keep is None:
        problems.append(f"{eid}: keep must be true or false, got {entry.get('keep')!r}")
        return
    stats.coerced += (eid != raw_id or keep is not entry.get("keep") or src != entry.get("src")
                      or dst != entry.get("dst"))
    out.rulings[eid] = (keep, str(entry.get("reason") or "")[:300])


def _read_addition(entry: dict[str, Any], nodes: dict[str, Node], stats: RefineStats, out: _Answer,
                   problems: list[str]) -> None:
    src, dst = str(entry.get("src") or ""), str(entry.get("dst") or "")
    fld, param = str(entry.get("field") or ""), str(entry.get("param") or "")
    if "." in src:  # "tool.field" in src
        src, fld = src.split(".", 1)[0], fld or src.split(".", 1)[1]
    fld = fld.removeprefix(f"{src}.")
    param = param.removeprefix(f"{dst}.")
    if src not in nodes or dst not in nodes or src == dst:
        stats.unknown_tool += 1
        problems.append(f"add: {src} -> {dst} does not name two tools of the API")
        return
    fields = {f.path for f in nodes[src].fields}
    required = {p.name for p in nodes[dst].params if p.required}
    if bool(fld) != bool(param) or (fld and fld not in fields) or (param and param not in required):
        stats.add_invalid += 1
        problems.append(f"add: {src}.{fld} -> {dst}.{param}: the field must be one of {src}'s output fields "
                        f"and the param a required input of {dst} (both empty for a logical edge)")
        return
    stats.coerced += (src, fld, dst, param) != (entry.get("src"), entry.get("field") or "", entry.get("dst"),
                                                  entry.get("param") or "")
    out.added[(src, fld, dst, param)] = str(entry.get("reason") or "")[:300]


def scripted_answer(prompt: str, *, keep: Callable[[str, str, str, str], bool],
                    add: Callable[[str], list[dict[str, str]]] = lambda tool: [],
                    kind: Callable[[str, str], str] = lambda tool, param: regex_kind(param)) -> str:
    """An answer to ``chunk_prompt`` text from rules: ``keep(src, field, dst, param)`` per candidate,
    ``add(tool)`` the edges into each tool to decide, ``kind(tool, param)`` per required input. For
    recording offline replays (benchmarks) and scripting the mock server in tests."""
    decide = prompt.split("\nDecide for: ", 1)[1].split("\n", 1)[0].split(", ")
    edges = [{"id": m[0], "keep": keep(m[1], m[2], m[3], m[4]), "reason": "scripted"}
             for m in _EDGE_LINE.findall(prompt)]
    params = []
    for tool in decide:
        block = prompt.split(f"\n## {tool}: ", 1)[1]
        line = block.split("inputs to classify: ", 1)[1].split("\n", 1)[0]
        names = [] if line == "(none)" else [item.split(" (", 1)[0] for item in line.split(" | ")]
        params += [{"tool": tool, "param": p, "kind": kind(tool, p)} for p in names]
    return json.dumps({"edges": edges, "add": [a for t in decide for a in add(t)], "params": params})
