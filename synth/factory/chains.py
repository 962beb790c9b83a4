"""Topology-aware chain sampling: walks along kept graph edges where every required parameter of
every step has a source, weighted so rarely used tools are picked first.

A parameter is bound, in this order of preference, to an earlier step's output field (through a
kept edge into it), to a column of the initial database (identifiers), or to a value the user
states in the task (free text, amounts, dates). A surrogate key (``*_id``) never comes from the
task: a user does not know ``hotel_id = 17``. Every step after the first takes at least one value
from an earlier step, so chains follow the graph. A tool appears once per chain, which is how
cycles in the graph are walked without looping; every walk is bounded by ``max_len`` and every
sampling run by an attempt budget, so nothing can hang.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable

from synth.factory.candidates import is_identifier
from synth.factory.dbvalues import DbColumns, db_source, strict_id
from synth.factory.model import Binding, Chain, Edge, Node, Step, ToolGraph


def chain_id(env: str, steps: list[Step]) -> str:
    """Stable id: the same env and steps give the same id in every run (resumes dedupe on it)."""
    blob = json.dumps({"env": env, "steps": [s.model_dump(mode="json") for s in steps]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def step_binding(edges: list[Edge], steps: list[Step]) -> Binding | None:
    """A binding to the output of the latest step whose tool is the source of one of ``edges``
    (the kept edges into a parameter): the value the user just saw. Both samplers bind this way."""
    for idx in range(len(steps) - 1, -1, -1):
        for e in edges:
            if e.src == steps[idx].tool:
                return Binding(kind="step", step=idx, field=e.field)
    return None


class ChainSampler:
    """Samples chains of one graph; ``coverage=False`` picks uniformly (for comparison)."""

    def __init__(self, graph: ToolGraph, columns: DbColumns, *, coverage: bool = True) -> None:
        self.graph = graph
        self.columns = columns
        self.coverage = coverage
        self.nodes: dict[str, Node] = {n.tool: n for n in graph.nodes}
        self.incoming: dict[tuple[str, str], list[Edge]] = defaultdict(list)
        self.successors: dict[str, set[str]] = defaultdict(set)
        self.predecessors: dict[str, set[str]] = defaultdict(set)
        self._hops: dict[str, dict[str, int]] = {}
        for e in graph.kept():
            if e.src in self.nodes and e.dst in self.nodes and e.src != e.dst:
                self.incoming[(e.dst, e.param)].append(e)
                self.successors[e.src].add(e.dst)
                self.predecessors[e.dst].add(e.src)
        self.uses: Counter[str] = Counter()
        self.starts = sorted(t for t in self.successors if self.bind(t, []) is not None)
        #: tools a walk may steer to: the starts and every tool an edge leads to
        self.targets = sorted(set(self.starts) | set(self.predecessors))

    def bind(self, tool: str, steps: list[Step]) -> dict[str, Binding] | None:
        """Bindings of every required parameter of ``tool`` after ``steps``, or None when one has
        no source (or, after the first step, none comes from an earlier step)."""
        out: dict[str, Binding] = {}
        for p in self.nodes[tool].params:
            if not p.required:
                continue
            binding = step_binding(self.incoming.get((tool, p.name), []), steps) or self._from_db_or_task(p.name)
            if binding is None:
                return None
            out[p.name] = binding
        if steps and not any(b.kind == "step" for b in out.values()):
            return None
        return out

    def _from_db_or_task(self, param: str) -> Binding | None:
        if is_identifier(param):
            where = db_source(param, self.columns)
            if where is not None:
                return Binding(kind="db", table=where[0], column=where[1])
        return None if strict_id(param) else Binding(kind="task")

    def _pick(self, rng: random.Random, options: list[str]) -> str:
        weights = [1.0 / (1 + self.uses[t]) ** 2 if self.coverage else 1.0 for t in options]
        return rng.choices(options, weights=weights, k=1)[0]

    def _hops_to(self, target: str) -> dict[str, int]:
        """Edges from each tool to ``target`` (reverse breadth-first search; bindings not checked)."""
        if target not in self._hops:
            hops, frontier = {target: 0}, [target]
            while frontier:
                nxt = []
                for tool in frontier:
                    for src in self.predecessors[tool]:
                        if src not in hops:
                            hops[src] = hops[tool] + 1
                            nxt.append(src)
                frontier = nxt
            self._hops[target] = hops
        return self._hops[target]

    def walk(self, rng: random.Random, max_len: int) -> list[Step]:
        """One chain of up to ``max_len`` steps (may be shorter when the graph runs out).

        With coverage on, the walk first picks a target tool (rarely used ones first) and steers
        towards it: a tool behind a single path is reached as often as a hub's neighbours.
        """
        if not self.starts:
            return []
        target = self._pick(rng, self.targets) if self.coverage else None
        hops = self._hops_to(target) if target else {}
        near = [t for t in self.starts if hops.get(t, max_len) < max_len]
        first = self._pick(rng, near or self.starts)
        steps = [Step(tool=first, bindings=self.bind(first, []) or {})]
        length = rng.randint(2, max(2, max_len))
        while len(steps) < length or (target and target not in {s.tool for s in steps} and len(steps) < max_len):
            used = {s.tool for s in steps}
            reachable = sorted({d for s in steps for d in self.successors[s.tool]} - used)
            options = {t: b for t in reachable if (b := self.bind(t, steps)) is not None}
            if not options:
                break
            if target in options:
                nxt = target
            else:
                left = max_len - len(steps) - 1
                steer = [t for t in options if target and target not in used and hops.get(t, max_len) <= left]
                nxt = self._pick(rng, steer or sorted(options))
            steps.append(Step(tool=nxt, bindings=options[nxt]))
        return steps


def sample_chains(graph: ToolGraph, columns: DbColumns, n: int, max_len: int = 4, seed: int = 0, *,
                  coverage: bool = True, max_attempts: int | None = None) -> list[Chain]:
    """Up to ``n`` distinct chains of 2..``max_len`` steps, deterministic under ``seed``.

    An env with no kept edges (or no tool that can start a chain) gives ``[]``.
    """
    sampler = ChainSampler(graph, columns, coverage=coverage)
    rng = random.Random(seed)
    if not sampler.starts:
        return []
    return collect_chains(graph.env, lambda: sampler.walk(rng, max_len), sampler.uses, n, max_attempts)


def collect_chains(env: str, walk: Callable[[], list[Step]], uses: Counter[str], n: int,
                   max_attempts: int | None = None) -> list[Chain]:
    """Up to ``n`` distinct chains of 2+ steps from ``walk()``, within an attempt budget (nothing
    hangs); ``uses`` counts each kept chain's tools (the walks steer to rarely used ones)."""
    chains: list[Chain] = []
    seen: set[str] = set()
    for _ in range(max_attempts if max_attempts is not None else 20 * n + 100):
        if len(chains) >= n:
            break
        steps = walk()
        if len(steps) < 2:
            continue
        cid = chain_id(env, steps)
        if cid in seen:
            continue
        seen.add(cid)
        uses.update(s.tool for s in steps)
        chains.append(Chain(env=env, chain_id=cid, steps=steps))
    return chains


def unsatisfied(chain: Chain, graph: ToolGraph, columns: DbColumns) -> list[str]:
    """Why a chain is not executable as sampled ([] when every required parameter is bound to a
    source that exists: an earlier step through a kept edge, a non-empty DB column, or the task,
    and every step after the first is connected: it takes from an earlier step, feeds a later one, or
    a kept logical edge links it to one)."""
    nodes = {n.tool: n for n in graph.nodes}
    kept = {(e.src, e.field, e.dst, e.param) for e in graph.kept()}
    problems = []
    for i, step in enumerate(chain.steps):
        node = nodes.get(step.tool)
        if node is None:
            problems.append(f"step {i}: unknown tool {step.tool}")
            continue
        for p in (p for p in node.params if p.required):
            b = step.bindings.get(p.name)
            if b is None:
                problems.append(f"step {i} {step.tool}: {p.name} unbound")
            elif b.kind == "step" and not (b.step is not None and 0 <= b.step < i and
                                           (chain.steps[b.step].tool, b.field, step.tool, p.name) in kept):
                problems.append(f"step {i} {step.tool}: {p.name} from a step without a kept edge")
            elif b.kind == "db" and not columns.get(b.table or "", {}).get(b.column or ""):
                problems.append(f"step {i} {step.tool}: {p.name} from empty column {b.table}.{b.column}")
            elif b.kind == "task" and strict_id(p.name):
                problems.append(f"step {i} {step.tool}: surrogate key {p.name} left to the user")
    fed = {b.step for s in chain.steps for b in s.bindings.values() if b.kind == "step"}
    logical = {(e.src, e.dst) for e in graph.kept() if e.logical}
    tools = [s.tool for s in chain.steps]
    for i, step in enumerate(chain.steps):
        linked = any((t, step.tool) in logical for t in tools[:i]) or any((step.tool, t) in logical for t in tools[i + 1:])
        if i and i not in fed and not linked and not any(b.kind == "step" for b in step.bindings.values()):
            problems.append(f"step {i} {step.tool}: takes nothing from an earlier step and feeds no later one")
    return problems
