"""Build, store and load one env's tool dependency graph (``<out>/factory/<env>/tool_graph.json``)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from envfarm.confined.runtime import EnvRuntime
from envfarm.errors import SynthesisError
from synth.factory.candidates import DEFAULT_THRESHOLD, candidate_edges
from synth.factory.fields import build_nodes
from synth.factory.model import ToolGraph
from synth.factory.refine import DEFAULT_BUDGET_CHARS, classify_by_name, refine_graph

GRAPH_FILE = "tool_graph.json"


def factory_dir(out: Path, env: str) -> Path:
    return Path(out) / "factory" / env


async def build_graph(runtime: EnvRuntime, *, embedder: Any, threshold: float = DEFAULT_THRESHOLD,
                      llm: Any = None, budget_chars: int = DEFAULT_BUDGET_CHARS) -> ToolGraph:
    """Nodes from the runtime, candidate edges, then the LLM refinement when ``llm`` is given (it
    prunes and adds edges and classifies parameters; ``synth.factory.refine``).

    Without an LLM every candidate (name match, or similarity >= ``threshold``) is kept and
    parameters are classified by the name rule.
    """
    started = time.perf_counter()
    nodes = await build_nodes(runtime)
    nodes_s = time.perf_counter() - started
    edges = await candidate_edges(nodes, embedder, threshold)
    candidates_s = time.perf_counter() - started - nodes_s
    stats: dict[str, Any] = {
        "tools": len(nodes),
        "fields_source": dict(Counter(n.fields_source for n in nodes)),
        "fields_failed": [f"{n.tool}: {n.note}" for n in nodes if n.fields_source == "none"],
        "candidates": len(edges),
        "candidates_by_source": dict(Counter(e.source for e in edges)),
        "embedding": embedder is not None,
    }
    if llm is not None:
        refined = await refine_graph(llm, runtime.name, nodes, edges, budget_chars=budget_chars)
        stats["llm"] = refined.as_dict()
    else:
        classify_by_name(nodes)
    stats["param_kinds"] = dict(Counter(f"{p.kind}/{p.kind_source}" for n in nodes for p in n.params if p.required))
    kept = [e for e in edges if e.kept]
    stats["kept"] = len(kept)
    stats["kept_by_source"] = dict(Counter(e.found_by or e.source for e in kept))
    stats["timings_s"] = {"nodes": round(nodes_s, 3), "candidates": round(candidates_s, 3),
                          "total": round(time.perf_counter() - started, 3)}
    return ToolGraph(env=runtime.name, nodes=nodes, edges=edges, threshold=threshold, stats=stats)


def save_graph(graph: ToolGraph, out: Path) -> Path:
    """Write atomically: a killed run leaves the old graph or the new one, never half of one."""
    folder = factory_dir(out, graph.env)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / GRAPH_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(graph.model_dump_json(indent=1))
    os.replace(tmp, path)
    return path


def load_graph(out: Path, env: str) -> ToolGraph:
    path = factory_dir(out, env) / GRAPH_FILE
    if not path.is_file():
        raise SynthesisError(f"no tool graph for {env!r} at {path}: run `envfarm synth graph` first")
    try:
        return ToolGraph.model_validate(json.loads(path.read_text()))
    except ValueError as exc:
        raise SynthesisError(f"{path} is not a tool graph: {str(exc)[:200]}") from exc
