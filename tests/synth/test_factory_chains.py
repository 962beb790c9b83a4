"""Topology-aware chain sampling: satisfiable steps, determinism, coverage, cycles, resume."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from envfarm import EnvRuntime
from synth._jsonl import read_jsonl
from synth.factory.chains import chain_id, sample_chains, unsatisfied
from synth.factory.dbvalues import db_columns
from synth.factory.graph import build_graph, save_graph
from synth.factory.model import Edge, Field_, Node, Param, ToolGraph
from tests.synth.factory_env import lending_bundle, no_edges_bundle


@pytest.fixture(scope="module")
def hotel(bundled_catalog):
    runtime = EnvRuntime(bundled_catalog["hotel_booking_1"])
    return asyncio.run(build_graph(runtime, embedder=None)), db_columns(runtime.template.data)


def _assert_satisfiable(chains, graph, columns, max_len):
    for c in chains:
        assert 2 <= len(c.steps) <= max_len
        assert unsatisfied(c, graph, columns) == [], c
        assert len({s.tool for s in c.steps}) == len(c.steps)
        assert c.chain_id == chain_id(c.env, c.steps)


def test_every_step_of_every_chain_is_satisfiable(hotel) -> None:
    graph, columns = hotel
    chains = sample_chains(graph, columns, n=60, max_len=4, seed=1)
    assert len(chains) == 60 and len({c.chain_id for c in chains}) == 60
    _assert_satisfiable(chains, graph, columns, 4)
    kinds = Counter(b.kind for c in chains for s in c.steps for b in s.bindings.values())
    assert kinds["step"] >= 60 and kinds["db"] > 0 and kinds["task"] > 0
    for c in chains:  # no surrogate key is left to the user
        assert not any(b.kind == "task" and p.endswith("_id") for s in c.steps for p, b in s.bindings.items())


def test_unsatisfied_catches_broken_bindings(hotel) -> None:
    graph, columns = hotel
    chain = sample_chains(graph, columns, n=1, max_len=3, seed=3)[0]
    step = chain.steps[1]
    name, binding = next((p, b) for p, b in step.bindings.items() if b.kind == "step")
    broken = chain.model_copy(deep=True)
    broken.steps[1].bindings[name] = binding.model_copy(update={"field": "no.such.field"})
    assert any("without a kept edge" in p for p in unsatisfied(broken, graph, columns))
    broken.steps[1].bindings.pop(name)
    assert any("unbound" in p for p in unsatisfied(broken, graph, columns))


def test_sampling_is_deterministic_under_a_seed(hotel) -> None:
    graph, columns = hotel
    a = sample_chains(graph, columns, n=25, max_len=4, seed=7)
    b = sample_chains(graph, columns, n=25, max_len=4, seed=7)
    c = sample_chains(graph, columns, n=25, max_len=4, seed=8)
    assert [x.model_dump() for x in a] == [x.model_dump() for x in b]
    assert [x.chain_id for x in a] != [x.chain_id for x in c]


def _node(tool: str, params: list[str] = (), fields: list[str] = ("id",)) -> Node:
    return Node(tool=tool, params=[Param(name=p, type="integer", required=True) for p in params],
                fields=[Field_(path=f, type="integer") for f in fields], fields_source="schema")


def _edge(src: str, dst: str, param: str, field: str = "id") -> Edge:
    return Edge(src=src, field=field, dst=dst, param=param, score=1.0, source="name", kept=True)


def _hub_graph() -> ToolGraph:
    """A hub feeds ten tools, each of which feeds ten sinks; one rare tool hangs behind one of them."""
    leaves, sinks = [f"leaf_{i}" for i in range(10)], [f"sink_{i}" for i in range(10)]
    nodes = [_node("hub"), *(_node(t, ["hub_id"]) for t in leaves), *(_node(t, ["leaf_id"]) for t in sinks),
             _node("rare", ["leaf_0_id"])]
    edges = [*(_edge("hub", t, "hub_id") for t in leaves), *(_edge(a, b, "leaf_id") for a in leaves for b in sinks),
             _edge("leaf_0", "rare", "leaf_0_id")]
    return ToolGraph(env="hub_1", nodes=nodes, edges=edges, threshold=0.6)


def test_coverage_weighting_reaches_rare_tools() -> None:
    graph = _hub_graph()
    weighted, uniform = Counter(), Counter()
    for seed in range(5):
        for counts, coverage in ((weighted, True), (uniform, False)):
            chains = sample_chains(graph, {}, n=20, max_len=3, seed=seed, coverage=coverage)
            _assert_satisfiable(chains, graph, {}, 3)
            counts.update(s.tool for c in chains for s in c.steps)
    assert set(weighted) == {n.tool for n in graph.nodes}  # every tool, the rare one included
    assert weighted["rare"] >= 3 > uniform["rare"]

    def spread(counts: Counter) -> int:
        used = [counts[n.tool] for n in graph.nodes if n.tool != "hub"]
        return max(used) - min(used)

    assert spread(weighted) < spread(uniform)


def _cycle_graph() -> ToolGraph:
    """start -> a -> b -> c -> a."""
    nodes = [_node("a", ["c_id"]), _node("b", ["a_id"]), _node("c", ["b_id"]), _node("start")]
    edges = [_edge("a", "b", "a_id"), _edge("b", "c", "b_id"), _edge("c", "a", "c_id"), _edge("start", "a", "c_id")]
    return ToolGraph(env="cycle_1", nodes=nodes, edges=edges, threshold=0.6)


def test_cycles_do_not_hang() -> None:
    graph = _cycle_graph()
    started = time.perf_counter()
    chains = sample_chains(graph, {}, n=1000, max_len=50, seed=0)
    assert time.perf_counter() - started < 5
    # only start -> a -> b -> c and its prefixes exist: a tool never repeats, so the cycle ends
    assert sorted(tuple(s.tool for s in c.steps) for c in chains) == [
        ("start", "a"), ("start", "a", "b"), ("start", "a", "b", "c")]
    _assert_satisfiable(chains, graph, {}, 50)


def test_env_without_edges_gives_no_chains(tmp_path) -> None:
    runtime = EnvRuntime(no_edges_bundle())
    graph = asyncio.run(build_graph(runtime, embedder=None))
    assert sample_chains(graph, db_columns(runtime.template.data), n=10, max_len=4, seed=0) == []
    # all edges rejected is the same as none
    hub = _hub_graph()
    for e in hub.edges:
        e.kept = False
    assert sample_chains(hub, {}, n=10, seed=0) == []


def test_db_bindings_point_at_real_columns() -> None:
    runtime = EnvRuntime(lending_bundle())
    graph = asyncio.run(build_graph(runtime, embedder=None))
    columns = db_columns(runtime.template.data)
    assert columns["books"]["id"] == 2 and columns["loans"]["id"] == 1
    chains = sample_chains(graph, columns, n=10, max_len=3, seed=0)
    _assert_satisfiable(chains, graph, columns, 3)
    firsts = {(c.steps[0].tool, p, b.table, b.column) for c in chains for p, b in c.steps[0].bindings.items()}
    assert ("get_book", "book_id", "books", "id") in firsts or ("lend_book", "book_id", "books", "id") in firsts


def test_cli_chains_resumes_without_duplicates(tmp_path, bundled_catalog) -> None:
    from synth.cli import app

    runtime = EnvRuntime(bundled_catalog["hotel_booking_1"])
    save_graph(asyncio.run(build_graph(runtime, embedder=None)), tmp_path)
    run = CliRunner()
    args = ["chains", "--out", str(tmp_path), "--env", "hotel_booking_1", "--seed", "3", "--max-len", "3"]
    res = run.invoke(app, [*args, "--n", "10"], catch_exceptions=False)
    assert res.exit_code == 0 and "10 new" in res.output, res.output
    path = tmp_path / "factory" / "hotel_booking_1" / "chains.jsonl"
    first = read_jsonl(path)
    with path.open("a") as fh:  # a run killed mid-write leaves a torn line
        fh.write('{"env": "hotel_booking_1", "chain_id": "torn')
    res = run.invoke(app, [*args, "--n", "15"], catch_exceptions=False)
    assert res.exit_code == 0 and "5 new, 15 in file" in res.output, res.output
    lines = read_jsonl(path)
    assert len(lines) == 15 and len({r["chain_id"] for r in lines}) == 15 and lines[:10] == first
    res = run.invoke(app, ["chains", "--out", str(tmp_path), "--env", "personal_banking_1"], catch_exceptions=False)
    assert res.exit_code == 1 and "run `envfarm synth graph` first" in res.output


def test_graph_then_chains_on_a_synth_output_folder(tmp_path) -> None:
    """A run folder as synth writes it (gen_db / gen_sample / gen_envs of library_1)."""
    import json

    from synth.cli import app
    from tests.fakes.synth_fixtures import library

    records = {"gen_db.jsonl": {"scenario": "library_1", "db_schema": {"tables": library.TABLES}},
               "gen_sample.jsonl": {"scenario": "library_1", "sample_data": {"tables": library.SAMPLE}},
               "gen_envs.jsonl": {"scenario": "library_1", "full_code": library.ENV_CODE}}
    for name, rec in records.items():
        (tmp_path / name).write_text(json.dumps(rec) + "\n")
    run = CliRunner()
    res = run.invoke(app, ["graph", str(tmp_path), "--out", str(tmp_path), "--no-llm", "--embedder", "none"],
                     catch_exceptions=False)
    assert res.exit_code == 0 and res.output.startswith("library_1: 5 tools"), res.output
    res = run.invoke(app, ["chains", str(tmp_path), "--out", str(tmp_path), "--n", "5"], catch_exceptions=False)
    assert res.exit_code == 0 and "library_1: 5 chains sampled" in res.output, res.output
    assert len(read_jsonl(tmp_path / "factory" / "library_1" / "chains.jsonl")) == 5


async def _execute(runtime, chain) -> list:
    """Run a chain with concrete values: earlier outputs, the first DB value, a stated placeholder."""
    from synth.factory.dbvalues import column_values
    from synth.factory.fields import field_values

    inst, results = runtime.instance(), []
    try:
        for step in chain.steps:
            args = {}
            for name, b in step.bindings.items():
                if b.kind == "step":
                    args[name] = field_values(results[b.step].result, b.field)[0]
                elif b.kind == "db":
                    args[name] = column_values(runtime.template.data, b.table, b.column)[0]
                else:
                    args[name] = "Ann"
            results.append(await inst.call(step.tool, args))
    finally:
        inst.close()
    return results


def test_sampled_chains_of_the_lending_env_execute() -> None:
    runtime = EnvRuntime(lending_bundle())
    graph = asyncio.run(build_graph(runtime, embedder=None))
    chains = sample_chains(graph, db_columns(runtime.template.data), n=20, max_len=3, seed=0)
    assert len(chains) >= 4
    for chain in chains:
        results = asyncio.run(_execute(runtime, chain))
        assert all(r.ok for r in results), (chain, [r.error for r in results])


def test_database_values_are_passed_as_the_schema_types() -> None:
    from synth.factory.execute import fit_schema

    flag, optional_flag = {"type": "boolean"}, {"anyOf": [{"type": "boolean"}, {"type": "null"}]}
    assert fit_schema(1, flag) is True and fit_schema("0", optional_flag) is False
    assert fit_schema("12", {"type": "integer"}) == 12 and fit_schema("2.5", {"type": "number"}) == 2.5
    assert fit_schema(7, {"type": "string"}) == "7" and fit_schema("x", {"type": "integer"}) == "x"
    assert fit_schema(3, {"type": "integer"}) == 3 and fit_schema(1, None) == 1


def test_backward_sampling_resolves_dependencies_first(hotel) -> None:
    from synth.factory.sampling import sample_backward

    graph, columns = hotel
    chains = sample_backward(graph, columns, n=60, max_len=4, seed=1)
    assert len(chains) == 60 and len({c.chain_id for c in chains}) == 60
    _assert_satisfiable(chains, graph, columns, 4)
    assert chains == sample_backward(graph, columns, n=60, max_len=4, seed=1)
    # branching: some step feeds two later steps, or one step takes from two earlier ones
    fan_out = any(Counter(b.step for s in c.steps for b in s.bindings.values() if b.kind == "step").most_common(1)
                  [0][1] >= 2 for c in chains if any(b.kind == "step" for s in c.steps for b in s.bindings.values()))
    fan_in = any(len({b.step for b in s.bindings.values() if b.kind == "step"}) >= 2 for c in chains for s in c.steps)
    assert fan_out or fan_in


def test_backward_p_brings_in_optional_predecessors() -> None:
    """``city`` is external (the user can say it), and ``find_city`` can also produce it: only
    with probability p does the sampler bring that producer in before ``book``."""
    from synth.factory.sampling import sample_backward

    nodes = [_node("find_city", fields=["city"]), _node("book", ["city"]), _node("confirm", ["id"])]
    edges = [_edge("find_city", "book", "city", field="city"), _edge("book", "confirm", "id")]
    graph = ToolGraph(env="trip_1", nodes=nodes, edges=edges, threshold=0.6)

    def with_producer(p: float) -> float:
        """Share of chains with ``book`` whose city comes from ``find_city``."""
        chains = sample_backward(graph, {}, n=40, max_len=3, seed=0, p=p)
        books = [s for c in chains for s in c.steps if s.tool == "book"]
        return sum(s.bindings["city"].kind == "step" for s in books) / len(books)

    assert with_producer(0.0) < with_producer(1.0) == 1.0


def test_backward_sampling_of_a_cycle_ends() -> None:
    from synth.factory.sampling import sample_backward

    graph = _cycle_graph()
    started = time.perf_counter()
    chains = sample_backward(graph, {}, n=1000, max_len=50, seed=0)
    assert time.perf_counter() - started < 30 and chains  # bounded even on a loaded machine
    _assert_satisfiable(chains, graph, {}, 50)


def test_backward_producer_of_a_surrogate_key_comes_first() -> None:
    from synth.factory.sampling import sample_backward

    runtime = EnvRuntime(lending_bundle())
    graph = asyncio.run(build_graph(runtime, embedder=None))
    columns = db_columns(runtime.template.data)
    chains = sample_backward(graph, columns, n=10, max_len=3, seed=0)
    returns = [c for c in chains if any(s.tool == "return_loan" for s in c.steps)]
    assert returns
    for c in returns:  # loan_id: lend_book returns it, so the loan is one this chain made
        i = next(i for i, s in enumerate(c.steps) if s.tool == "return_loan")
        b = c.steps[i].bindings["loan_id"]
        assert b.kind == "step" and c.steps[b.step].tool == "lend_book"
