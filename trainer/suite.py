"""A task suite to learn from: hundreds of gated EnvFactory tasks on the bundled envs, split into
train and held-out tasks by unseen values and unseen chains (never by env).

    suite = build_suite(SuiteConfig())        # built once, cached under a key of its config
    suite.catalog                             # a catalog folder the farm serves (``--catalog``)
    suite.jobs("train"), suite.jobs("heldout")

Per env, EnvFactory's pipeline without an LLM: the tool graph (name matches), ``chains`` sampled
chains, each executed with ``draws`` value draws (``synth.factory.execute``), the request of each
written by ``synth.factory.template_writer`` (a TEMPLATE: every figure built on the suite says so),
each chain run from a starting database of its own (``synth.factory.scenario``), its verifiers
templated from the end state, exact both ways (code mode, and sql mode for the LLM judge), then the
acceptance gate (:data:`Gate`, pluggable; :func:`replay_gate` is EnvFactory's): the reference
replayed passes and a no-op does not, every hack probe of ``envfarm.hackprobes`` fails (no-op,
echo, guesses, dump, a destructive side effect, the reference without its last write), and the
reference played through the agent loop and a farm passes. The accepted tasks are appended to a
copy of the env (``synth.factory.export``), each with its starting database.

The split, per env: whole chains are held out (``heldout_chains``; only chains whose every tool is
used by some train chain, so a held-out chain is a new composition of steps seen in training), and
one draw of some train chains (``heldout_values``: the chain was trained on, these values were
not). ``suite.json`` lists every task with its chain, draw and split.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SPLITS = ("train", "heldout_values", "heldout_chains")
_VERSION = "4"  # 2: numbered steps; 3: the hack probes, exact verifiers; 4: arguments as JSON  # bump when the build changes in a way the config cannot show


class SuiteConfig(BaseModel):
    """What the suite is made of; its hash names the cached build."""

    model_config = ConfigDict(extra="forbid")

    envs: list[str] | None = Field(default=None, description="bundled envs; None: every servable one")
    chains: int = Field(default=200, ge=1, description="chains sampled per env")
    max_len: int = Field(default=4, ge=2, description="longest chain (calls)")
    draws: int = Field(default=3, ge=1, description="value draws per chain (each one task)")
    seed: int = 0
    scenario_keep: float | None = Field(default=0.75, ge=0, le=1, description="each chain starts from a "
                                        "database of its own (synth.factory.scenario); None: the sample data")
    sql_verifiers: bool = Field(default=True, description="also an sql-mode verifier per task (facts "
                                "for the LLM judge: the llm reward path reads them)")
    read_only: bool = Field(default=False, description="keep chains that change nothing (their "
                            "verifier checks the answer only; off: see the module doc of suite)")
    heldout_chains: float = Field(default=0.15, ge=0, lt=1, description="share of each env's chains "
                                  "held out whole")
    heldout_values: float = Field(default=0.25, ge=0, lt=1, description="share of the train chains "
                                  "with two or more draws that give one draw to held-out")
    dir: str | None = Field(default=None, description="where to build; None: the cache "
                            "($ENVFARM_CACHE or ~/.cache/envfarm)/suites/<key>")

    def key(self) -> str:
        blob = json.dumps({"v": _VERSION, **self.model_dump(exclude={"dir"})}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def folder(self) -> Path:
        if self.dir:
            return Path(self.dir)
        root = Path(os.environ.get("ENVFARM_CACHE") or Path.home() / ".cache" / "envfarm")
        return root / "suites" / f"suite-{self.key()}"


class Suite:
    """A built suite: its catalog folder and its tasks by split."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.manifest = json.loads((folder / "suite.json").read_text(encoding="utf-8"))
        self.tasks: list[dict[str, Any]] = self.manifest["tasks"]

    @property
    def catalog(self) -> Path:
        return self.folder / "factory_catalog"

    @property
    def envs(self) -> list[str]:
        return sorted({t["env"] for t in self.tasks})

    def jobs(self, split: str) -> list[tuple[str, int]]:
        """(env, task_idx) of a split: train, heldout_values, heldout_chains, or heldout (both)."""
        want = ("heldout_values", "heldout_chains") if split == "heldout" else (split,)
        return [(t["env"], t["task_idx"]) for t in self.tasks if t["split"] in want]

    def split_of(self, env: str, task_idx: int) -> str:
        return next(t["split"] for t in self.tasks if t["env"] == env and t["task_idx"] == task_idx)


#: (runtime, [(episode, gate candidate)] of one env, verifier sandbox) -> (accepted?, reason) each
Gate = Callable[[Any, list[tuple[Any, Any]], Any], Awaitable[list[tuple[bool, str]]]]


async def replay_gate(runtime: Any, made: list[tuple[Any, Any]], sandbox: Any) -> list[tuple[bool, str]]:
    """EnvFactory's gate (``synth.factory.gate.gate_batch``): the hack probes fail the verifier,
    and the reference solution played through the agent loop on a farm passes it (the replay
    check ran when the candidate was made). The requests state every step and value, so the
    agent that follows one exactly is the reference."""
    from synth.factory.gate import AgentSolver, code_judge, gate_batch
    from trainer.episode import EpisodeConfig, run_episode
    from trainer.policy import ScriptedPolicy

    first = len(runtime.bundle.tasks)
    env = runtime.bundle.name
    policy = ScriptedPolicy({(env, first + i): episode.calls for i, (episode, _) in enumerate(made)},
                            {(env, first + i): episode.final_answer for i, (episode, _) in enumerate(made)
                             if episode.final_answer})
    solver = AgentSolver(run_episode, policy, EpisodeConfig(max_turns=16, tool_listing="names"))
    results = await gate_batch(runtime.bundle, [c for _, c in made], solver, code_judge(sandbox),
                               concurrency=4, runtime=runtime)
    return [(r.accepted, r.reason) for r in results]


def build_suite(cfg: SuiteConfig, gate: Gate | None = None, log: Any = print) -> Suite:
    """The suite of ``cfg``, built unless its folder holds one already."""
    folder = cfg.folder()
    if (folder / "suite.json").is_file():
        return Suite(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tasks, stats = asyncio.run(_build(cfg, folder, gate, log))
    manifest = {"writer": _writer_label(), "config": cfg.model_dump(exclude={"dir"}), "key": cfg.key(),
                "counts": _counts(tasks), "stats": stats, "tasks": tasks}
    tmp = folder / "suite.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    tmp.replace(folder / "suite.json")  # written last: a folder without it is rebuilt
    return Suite(folder)


def _writer_label() -> str:
    from synth.factory.template_writer import WRITER

    return WRITER


async def _build(cfg: SuiteConfig, folder: Path, gate: Gate | None, log: Any
                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from envfarm.catalog import load_catalog
    from judge import VerifierSandbox
    from synth.factory.export import export_env

    catalog = load_catalog()
    names = [catalog[e].name for e in (cfg.envs or catalog.servable)]
    tasks: list[dict[str, Any]] = []
    stats: dict[str, Any] = {}
    with VerifierSandbox(workers=2, timeout_s=10.0) as sandbox:
        for name in names:
            accepted, stats[name] = await _env_episodes(cfg, catalog[name], sandbox, gate)
            split = split_tasks([(e.chain_id, draw, [c.tool for c in e.calls]) for e, draw in accepted],
                                cfg.heldout_chains, cfg.heldout_values, f"{cfg.seed}:{name}")
            row = export_env(catalog, name, folder, [e for e, _ in accepted])
            for i, ((episode, draw), part) in enumerate(zip(accepted, split, strict=True)):
                tasks.append({"env": name, "task_idx": row["first_task"] + i, "chain_id": episode.chain_id,
                              "draw": draw, "split": part, "calls": len(episode.calls),
                              "tools": [c.tool for c in episode.calls]})
            log(json.dumps({"env": name, **stats[name], **_counts([t for t in tasks if t["env"] == name])}))
    return tasks, stats


async def _env_episodes(cfg: SuiteConfig, bundle: Any, sandbox: Any, gate: Gate | None
                        ) -> tuple[list[tuple[Any, int]], dict[str, Any]]:
    """The env's gated episodes with their draw, in chain order; and what was dropped, by reason."""
    from collections import Counter

    from envfarm import EnvRuntime
    from synth.factory.chains import sample_chains
    from synth.factory.dbvalues import db_columns
    from synth.factory.graph import build_graph
    from synth.factory.queries import make_candidate
    from synth.factory.template_writer import TemplateWriter
    from synth.guard import read_written_tables

    runtime = EnvRuntime(bundle)
    ignore = await read_written_tables(runtime)
    columns = db_columns(runtime.template.data)
    graph = await build_graph(runtime, embedder=None)
    chains = sample_chains(graph, columns, n=cfg.chains, max_len=cfg.max_len, seed=cfg.seed)
    writer = TemplateWriter.for_tools(runtime.tools)
    drops: Counter[str] = Counter()
    made, seen = [], set()
    for chain in chains:
        for draw in range(cfg.draws):
            episode, candidate = await make_candidate(runtime, chain, columns, None, sandbox, seed=draw,
                                                      ignore=ignore, keep=cfg.scenario_keep, writer=writer,
                                                      sql=cfg.sql_verifiers)
            key = json.dumps([[c.tool, c.arguments] for c in episode.calls], sort_keys=True, default=str)
            if candidate is None or key in seen:
                drops[episode.reason or "same_values"] += 1
                continue
            if episode.final_answer is not None and not cfg.read_only:
                drops["read_only"] += 1
                continue
            seen.add(key)
            made.append((episode, candidate, draw))
    verdicts = await (gate or replay_gate)(runtime, [(e, c) for e, c, _ in made], sandbox)
    accepted = []
    for (episode, _, draw), (ok, reason) in zip(made, verdicts, strict=True):
        if ok:
            accepted.append((episode, draw))
        else:
            drops[reason] += 1
    return accepted, {"chains": len(chains), "candidates": len(made), "accepted": len(accepted),
                      "dropped": dict(sorted(drops.items()))}


def split_tasks(items: list[tuple[str, int, list[str]]], chains_share: float, values_share: float,
                seed: str) -> list[str]:
    """The split of each (chain_id, draw, tools): whole chains to ``heldout_chains`` while every tool
    they use stays in some train chain; then one draw of some train chains to ``heldout_values``."""
    rng = random.Random(seed)
    by_chain: dict[str, list[int]] = {}
    for i, (chain, _, _) in enumerate(items):
        by_chain.setdefault(chain, []).append(i)
    tools = {chain: set(items[idx[0]][2]) for chain, idx in by_chain.items()}
    order = sorted(by_chain)
    rng.shuffle(order)
    held: set[str] = set()
    for chain in order:
        if len(held) >= round(chains_share * len(by_chain)):
            break
        train = [c for c in by_chain if c not in held and c != chain]
        covered = set().union(*(tools[c] for c in train)) if train else set()
        if all(tools[h] <= covered for h in held | {chain}):
            held.add(chain)
    split = {i: "heldout_chains" for c in held for i in by_chain[c]}
    multi = [c for c in order if c not in held and len(by_chain[c]) >= 2]
    for chain in multi[:round(values_share * len(multi))]:
        split[by_chain[chain][-1]] = "heldout_values"
    return [split.get(i, "train") for i in range(len(items))]


def _counts(tasks: list[dict[str, Any]]) -> dict[str, int]:
    return {s: sum(t["split"] == s for t in tasks) for s in SPLITS}
