"""``synth graph`` and ``synth chains`` over a catalog: one env at a time, a broken env is a row, not a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envfarm.catalog import load_catalog
from envfarm.errors import EnvfarmError
from synth._jsonl import JsonlStore
from synth._probe import load_runtime
from synth.factory.candidates import DEFAULT_THRESHOLD
from synth.factory.chains import sample_chains
from synth.factory.dbvalues import db_columns
from synth.factory.graph import build_graph, factory_dir, load_graph, save_graph
from synth.factory.refine import DEFAULT_BUDGET_CHARS
from synth.factory.sampling import DEFAULT_K, DEFAULT_P, sample_backward

CHAINS_FILE = "chains.jsonl"


def catalog_envs(catalog_path: Path | None, names: list[str] | None) -> tuple[Any, list[str]]:
    """The catalog and the envs to work on: ``names``, or every servable env."""
    catalog = load_catalog(catalog_path)
    return catalog, [catalog[n].name for n in names] if names else catalog.servable


async def graph_catalog(catalog_path: Path | None, out: Path, *, envs: list[str] | None = None,
                        embedder: Any, threshold: float = DEFAULT_THRESHOLD, llm: Any = None,
                        budget_chars: int = DEFAULT_BUDGET_CHARS, tool_timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Build and store every env's graph; one summary row per env (``error`` when it did not load)."""
    catalog, names = catalog_envs(catalog_path, envs)
    rows = []
    for name in names:
        runtime, why = load_runtime(catalog[name], tool_timeout_s)
        if runtime is None:
            rows.append({"env": name, "error": why})
            continue
        graph = await build_graph(runtime, embedder=embedder, threshold=threshold, llm=llm,
                                  budget_chars=budget_chars)
        path = save_graph(graph, out)
        rows.append({"env": name, "path": str(path), **graph.stats})
    return rows


def chains_catalog(catalog_path: Path | None, out: Path, *, envs: list[str] | None = None, n: int = 50,
                   max_len: int = 4, seed: int = 0, sampler: str = "backward", p: float = DEFAULT_P,
                   k: int = DEFAULT_K, tool_timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Sample ``n`` chains per env into ``<out>/factory/<env>/chains.jsonl``; chains already there
    (same ``chain_id``) are not written again, so a killed or repeated run adds only what is missing."""
    catalog, names = catalog_envs(catalog_path, envs)
    rows = []
    for name in names:
        try:
            graph = load_graph(out, name)
        except EnvfarmError as exc:
            rows.append({"env": name, "error": exc.message})
            continue
        runtime, why = load_runtime(catalog[name], tool_timeout_s)
        if runtime is None:
            rows.append({"env": name, "error": why})
            continue
        columns = db_columns(runtime.template.data)
        if sampler == "backward":
            chains = sample_backward(graph, columns, n, max_len, seed, p=p, k=k)
        else:  # the forward walk of issue 10, for comparison
            chains = sample_chains(graph, columns, n, max_len, seed)
        store = JsonlStore(factory_dir(out, name) / CHAINS_FILE, lambda r: r["chain_id"])
        added = sum(store.append_once(c.model_dump(mode="json")) for c in chains)
        rows.append({"env": name, "kept_edges": len(graph.kept()), "sampled": len(chains), "added": added,
                     "in_file": len(store), "tools_covered": len({s.tool for c in chains for s in c.steps})})
    return rows


def format_graph_row(row: dict[str, Any]) -> str:
    fs, llm = row["fields_source"], row.get("llm")
    text = (f"{row['env']}: {row['tools']} tools (fields: {fs.get('schema', 0)} schema, {fs.get('probe', 0)} probe, "
            f"{fs.get('none', 0)} none); candidates {row['candidates']} {_counts(row['candidates_by_source'])}; "
            f"kept {row['kept']} {_counts(row['kept_by_source'])}; {row['timings_s']['total']:.1f} s")
    if llm:
        text += (f"; LLM {llm['calls']} calls, rejected {llm['rejected']}, added {llm['added']} "
                 f"(+{llm['added_logical']} logical), params by LLM {llm['kinds_llm']} "
                 f"(name rule {llm['kinds_fallback']}), unconfirmed {llm['unconfirmed']} "
                 f"(malformed {llm['malformed']}, unknown tool {llm['unknown_tool']}, unknown edge "
                 f"{llm['unknown_edge']}, errors {llm['llm_errors']})")
    return text


def format_chains_row(row: dict[str, Any]) -> str:
    return (f"{row['env']}: {row['sampled']} chains sampled from {row['kept_edges']} kept edges, "
            f"{row['added']} new, {row['in_file']} in file, {row['tools_covered']} tools covered")


def _counts(by: dict[str, int]) -> str:
    return "(" + ", ".join(f"{k} {v}" for k, v in sorted(by.items())) + ")" if by else ""
