"""EnvFactory's QueryGen stage on the three bundled envs, offline.

    python benchmarks/synth/bench_factory_queries.py [--chains 50] [--out benchmarks/results/factory_queries.json]

Per env: the tool graph (name matches only, no LLM: the embedding/LLM graph is measured by
bench_factory_graph.py), ``--chains`` chains sampled (max 4 steps, seed 0), then every chain
executed on fresh instances (chains/s, drops by reason) and taken through QueryGen and the gate
against the in-process mock OpenAI server: a SCRIPTED QueryGen that describes each turn's calls in
a user's words and an HONEST scripted agent (through the trainer's real agent loop and an
in-process farm) that sees only that text and the tools, and finds what it names by reading
(``tests/fakes/factory_agent.py``). It measures the pipeline and the gate, not a model's writing
or solving. ``passed_replay`` counts the episodes the replay-only gate (the one before issue 22)
would have accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from envfarm.catalog import load_catalog
from envfarm.confined.runtime import EnvRuntime
from envfarm.llm import LLMClient, LLMConfig
from judge import VerifierSandbox
from synth.factory.chains import sample_chains
from synth.factory.dbvalues import db_columns
from synth.factory.execute import DROP_CALL_FAILED, DROP_NO_VALUE, execute_chain
from synth.factory.gate import DROP_HACKABLE, DROP_SOLVER_ERROR, DROP_UNSOLVED
from synth.factory.graph import build_graph
from synth.factory.queries import DROP_AMBIGUOUS, make_episodes
from tests.fakes.mock_openai import MockOpenAI
from tests.fakes.factory_agent import script_world, scripted_solver

#: reasons given after the replay check passed: the solving gate's own drops
SOLVING_GATE = (DROP_AMBIGUOUS, DROP_HACKABLE, DROP_UNSOLVED, DROP_SOLVER_ERROR)


async def bench_env(runtime: EnvRuntime, n: int, llm: LLMClient, sandbox: VerifierSandbox, solver) -> dict:
    graph = await build_graph(runtime, embedder=None)
    columns = db_columns(runtime.template.data)
    chains = sample_chains(graph, columns, n=n, max_len=4, seed=0)
    started = time.perf_counter()
    first_try = Counter()
    for chain in chains:  # one execution each, as sampled: the raw executability of the chains
        ex = await execute_chain(runtime, chain, columns, "0.0")
        first_try[ex.drop or "ok"] += 1
    exec_s = time.perf_counter() - started
    started = time.perf_counter()
    episodes = await make_episodes(runtime, chains, columns, llm, sandbox, solver, concurrency=4)
    full_s = time.perf_counter() - started
    drops = Counter(e.reason for e in episodes if not e.accepted)
    return {
        "env": runtime.name, "tools": len(graph.nodes), "kept_edges": len(graph.kept()), "chains": len(chains),
        "executed_first_try": first_try["ok"], "first_try_drops": dict(first_try - Counter(ok=first_try["ok"])),
        "chains_executed_per_s": round(len(chains) / exec_s, 1),
        "executable_after_retries": sum(e.reason not in (DROP_CALL_FAILED, DROP_NO_VALUE) for e in episodes),
        "passed_replay": sum(e.accepted or e.reason in SOLVING_GATE for e in episodes),
        "accepted": sum(e.accepted for e in episodes), "drops": dict(sorted(drops.items())),
        "episodes_per_s": round(len(chains) / full_s, 2), "queries_stage_s": round(full_s, 2),
        "tools_in_accepted": len({c.tool for e in episodes if e.accepted for c in e.calls}),
    }


async def main(n: int, catalog_dir: Path | None) -> list[dict]:
    catalog = load_catalog(catalog_dir)
    rows = []
    with MockOpenAI() as mock, VerifierSandbox(workers=2, timeout_s=10.0) as sandbox:
        script_world(mock)
        solver = scripted_solver(mock)
        async with LLMClient(LLMConfig(base_url=mock.url, model="mock", max_retries=0)) as llm:
            for name in catalog.servable:
                rows.append(await bench_env(EnvRuntime(catalog[name]), n, llm, sandbox, solver))
                print(json.dumps(rows[-1]), flush=True)
        await solver.aclose()
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chains", type=int, default=50)
    ap.add_argument("--catalog", type=Path, default=None,
                    help="catalog folder (e.g. a folder of AgentWorldModel-1K samples); default: the bundled one")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "factory_queries.json")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    rows = asyncio.run(main(args.chains, args.catalog))
    result = {"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
              "machine": f"{os.cpu_count()} cores, shared; 1-min load {load_start:.2f} at start, "
                         f"{os.getloadavg()[0]:.2f} at end",
              "catalog": str(args.catalog or "bundled"), "chains_per_env": args.chains, "max_len": 4, "seed": 0,
              "llm": "scripted (tests/fakes/factory_agent.py), not a model", "envs": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
