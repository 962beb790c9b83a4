"""Topology-aware sampling as EnvFactory specifies it (Section 3.3.2): backward dependency
resolution, then branching to neighbours.

A tool is added to a chain only once every required parameter is *independent*: external (the
user states it: a name, a date, an amount), or internal and produced by a tool already in the
chain. For an internal parameter no tool in the chain produces, the sampler picks a producer along
the graph's inverse edges and resolves *its* parameters first, recursively; with a small
probability ``p`` it also brings in a producer for a parameter that was already satisfiable
(diversity). Once a tool is placed, 1..``k`` of its neighbours along outgoing edges are added the
same way (equal probability), which gives branching, non-linear chains: two producers feeding one
tool, one result feeding two tools.

Internal/external is the graph's classification of each parameter (the LLM's, or the name rule:
``hotel_id``, ``confirmation_code``); an internal parameter no tool of the graph produces is read from
the database, as the user's own data (``db``). A tool linked only by *logical* edges (it takes or
returns no data: ``delete_all_notes``) gets a logical predecessor when it has no required input,
else with probability ``p``, and logical edges are neighbours like any other. Every walk is bounded
by ``max_len`` and the recursion by the chain, so nothing can hang; the same seed gives the same
chains.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict

from synth.factory.chains import collect_chains, step_binding
from synth.factory.dbvalues import DbColumns, db_source, strict_id
from synth.factory.model import Binding, Chain, Edge, Node, Step, ToolGraph
from synth.factory.refine import regex_kind

DEFAULT_P = 0.1   # optional predecessor for a parameter already satisfiable
DEFAULT_K = 2     # at most this many neighbours per placed tool


class _Full(Exception):
    """The chain reached ``max_len`` while resolving: this walk stops."""


class BackwardSampler:
    def __init__(self, graph: ToolGraph, columns: DbColumns, *, p: float = DEFAULT_P, k: int = DEFAULT_K) -> None:
        self.graph, self.columns, self.p, self.k = graph, columns, p, k
        self.nodes: dict[str, Node] = {n.tool: n for n in graph.nodes}
        self.incoming: dict[tuple[str, str], list[Edge]] = defaultdict(list)
        self.successors: dict[str, list[str]] = defaultdict(list)
        self.logical_in: dict[str, list[str]] = defaultdict(list)
        for e in graph.kept():
            if e.src in self.nodes and e.dst in self.nodes and e.src != e.dst:
                if e.logical:
                    self.logical_in[e.dst].append(e.src)
                else:
                    self.incoming[(e.dst, e.param)].append(e)
                if e.dst not in self.successors[e.src]:
                    self.successors[e.src].append(e.dst)
        self.uses: Counter[str] = Counter()

    def internal(self, tool: str, param: str) -> bool:
        p = next((p for p in self.nodes[tool].params if p.name == param), None)
        if p is not None and p.kind is not None:
            return p.kind == "internal"
        return regex_kind(param) == "internal"  # a graph from before the classification

    def _producer_edges(self, tool: str, param: str, exclude: set[str]) -> list[Edge]:
        return [e for e in self.incoming.get((tool, param), []) if e.src not in exclude]

    def _fallback(self, tool: str, param: str) -> Binding | None:
        """A parameter no tool in the chain produces: an id from the database (the user's own
        data), else a value the user states; None for a surrogate key the database lacks."""
        where = db_source(param, self.columns) if self.internal(tool, param) else None
        if where is not None:
            return Binding(kind="db", table=where[0], column=where[1])
        return None if strict_id(param) else Binding(kind="task")

    def resolve(self, tool: str, steps: list[Step], path: set[str], rng: random.Random, max_len: int) -> bool:
        """Append ``tool`` to ``steps`` after the producers its parameters need (recursively);
        False (``steps`` unchanged) when some parameter cannot be satisfied."""
        if any(s.tool == tool for s in steps):
            return True
        mark = len(steps)
        try:
            required = [p for p in self.nodes[tool].params if p.required]
            before = [t for t in self.logical_in.get(tool, []) if t not in path]
            if before and not any(s.tool in before for s in steps) and (not required or rng.random() < self.p):
                self.resolve(rng.choice(before), steps, path | {tool}, rng, max_len)
            bindings: dict[str, Binding] = {}
            for p in required:
                edges = self.incoming.get((tool, p.name), [])
                binding = step_binding(edges, steps)
                producers = self._producer_edges(tool, p.name, path | {tool})
                wanted = self.internal(tool, p.name) and binding is None
                if producers and (wanted or rng.random() < self.p):
                    e = rng.choice(producers)
                    if self.resolve(e.src, steps, path | {tool}, rng, max_len):
                        binding = step_binding(edges, steps) or binding
                binding = binding or self._fallback(tool, p.name)
                if binding is None:
                    raise LookupError(p.name)
                bindings[p.name] = binding
            if len(steps) >= max_len:
                raise _Full
            steps.append(Step(tool=tool, bindings=bindings))
            return True
        except LookupError:
            del steps[mark:]
            return False
        except _Full:
            del steps[mark:]  # the producers placed for a tool that does not fit feed nothing
            raise

    def walk(self, rng: random.Random, max_len: int) -> list[Step]:
        """One chain: a rarely used tool resolved backward, then its neighbours (1..k each)."""
        tools = sorted(self.nodes)
        weights = [1.0 / (1 + self.uses[t]) ** 2 for t in tools]
        steps: list[Step] = []
        root = rng.choices(tools, weights=weights, k=1)[0]
        try:
            if not self.resolve(root, steps, set(), rng, max_len):
                return []
            frontier = [root]
            while frontier:
                tool = frontier.pop(0)
                options = [t for t in self.successors[tool] if all(s.tool != t for s in steps)]
                rng.shuffle(options)
                for nxt in options[:rng.randint(1, self.k)] if options else []:
                    if self.resolve(nxt, steps, set(), rng, max_len):
                        frontier.append(nxt)
        except _Full:
            pass
        return steps


def sample_backward(graph: ToolGraph, columns: DbColumns, n: int, max_len: int = 4, seed: int = 0, *,
                    p: float = DEFAULT_P, k: int = DEFAULT_K, max_attempts: int | None = None) -> list[Chain]:
    """Up to ``n`` distinct chains of 2..``max_len`` steps, deterministic under ``seed``."""
    sampler = BackwardSampler(graph, columns, p=p, k=k)
    rng = random.Random(seed)
    if not sampler.successors:
        return []
    return collect_chains(graph.env, lambda: sampler.walk(rng, max_len), sampler.uses, n, max_attempts)
