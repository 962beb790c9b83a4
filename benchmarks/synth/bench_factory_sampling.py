"""Executable-chain rates of EnvFactory's two samplers on the same graphs, offline.

    python benchmarks/synth/bench_factory_sampling.py [--chains 50] [--catalog DIR] [--out benchmarks/results/factory_sampling.json]

Per env: the tool graph from name matches only (no embeddings, no LLM), then ``--chains`` chains
(max 4 steps, seed 0) from the forward walk (issue 10) and from backward dependency resolution
(issue 22: p 0.1, k 2), each executed on fresh instances with the draws ``synth queries`` makes
(up to 5 value draws, then 2 with optional parameters filled): executable on the first draw and
within the 7, and why the rest failed; each sampler's chains run three ways: values drawn on their
own (``independent``: the draw before issue 22's item 2), drawn from rows that agree with the
chain's rows and the acting user (``consistent``), and that plus a refused step drawn again with
other values, up to 4 calls, and each redraw avoiding the values a failed call was given
(``consistent_retried``: what ``synth queries`` does). No LLM is involved: the counts are deterministic under the
seed, only the timings depend on the machine.
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
from envfarm.runtime import EnvRuntime
from synth.factory.chains import sample_chains
from synth.factory.dbvalues import db_columns
from synth.factory.execute import STEP_TRIES, execute_drawing
from synth.factory.graph import build_graph
from synth.factory.sampling import sample_backward

DRAWS = {"independent": {"consistent": False, "avoid_failed": False, "step_tries": 1},  # before issue 22 item 2
         "consistent": {"consistent": True, "avoid_failed": False, "step_tries": 1},
         "consistent_retried": {"consistent": True, "avoid_failed": True, "step_tries": STEP_TRIES}}  # synth queries


async def executability(runtime: EnvRuntime, chains: list, columns: dict, draw: dict) -> dict:
    first, final = Counter(), Counter()
    unpinned = 0
    for chain in chains:
        drawn = await execute_drawing(runtime, chain, columns, 0, **draw)
        first[drawn[0].executed.drop or "ok"] += 1
        final[drawn[-1].executed.drop or "ok"] += 1
        unpinned += sum(d.executed.unpinned for d in drawn)

    def branching(c) -> bool:  # a step feeds two later steps, or takes from two earlier ones
        fed = Counter(b.step for s in c.steps for b in s.bindings.values() if b.kind == "step")
        takes = [len({b.step for b in s.bindings.values() if b.kind == "step"}) for s in c.steps]
        return max(fed.values(), default=0) > 1 or max(takes, default=0) > 1

    return {"chains": len(chains), "executable_first_draw": first["ok"], "executable_7_draws": final["ok"],
            "unpinned_values": unpinned,
            "drops": dict(sorted((final - Counter(ok=final["ok"])).items())),
            "mean_steps": round(sum(len(c.steps) for c in chains) / max(1, len(chains)), 2),
            "tools_covered": len({s.tool for c in chains for s in c.steps}),
            "ids_from_db": sum(b.kind == "db" for c in chains for s in c.steps for b in s.bindings.values()),
            "branching": sum(branching(c) for c in chains)}


async def main(n: int, catalog_dir: Path | None, envs: list[str]) -> list[dict]:
    catalog = load_catalog(catalog_dir)
    rows = []
    for name in envs or catalog.servable:
        runtime = EnvRuntime(catalog[name])
        graph = await build_graph(runtime, embedder=None)
        columns = db_columns(runtime.template.data)
        row = {"env": name, "tools": len(graph.nodes), "kept_edges": len(graph.kept())}
        for label, sample in (("forward", sample_chains), ("backward", sample_backward)):
            started = time.perf_counter()
            chains = sample(graph, columns, n, 4, 0)
            row[label] = {"sample_s": round(time.perf_counter() - started, 3)}
            for draw, how in DRAWS.items():
                row[label][draw] = await executability(runtime, chains, columns, how)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chains", type=int, default=50)
    ap.add_argument("--env", action="append", default=[], help="only this env (repeatable)")
    ap.add_argument("--catalog", type=Path, default=None, help="catalog folder; default: the bundled one")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "factory_sampling.json")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    rows = asyncio.run(main(args.chains, args.catalog, args.env))
    result = {"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
              "machine": f"{os.cpu_count()} cores, shared; 1-min load {load_start:.2f} at start, "
                         f"{os.getloadavg()[0]:.2f} at end",
              "catalog": str(args.catalog or "bundled"), "chains_per_env": args.chains, "max_len": 4, "seed": 0,
              "envs": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
