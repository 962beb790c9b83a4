"""LLM answers are validated (synth/_answers.py): a malformed field takes the parse-error / repair
path; it neither crashes a stage nor gets misread (``bool("false")`` is True)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synth._answers import ClassifierAnswer, SolutionAnswer, fix_target, parse_answer
from synth._jsonl import read_jsonl
from synth._parse import ParseError
from tests.fakes.mock_openai import MockOpenAI
from tests.fakes.synth_fixtures import library
from tests.fakes.scripted_synth import _j, script_pipeline
from tests.synth.test_integrity import _one_scenario, _report, _run
from tests.synth.test_scenario_stage import _run as run_scenarios


def test_booleans_and_indexes_are_read_as_meant_or_refused() -> None:
    ans = parse_answer(_j({"results": [{"index": "0", "crud_suitable": "false"},
                                       {"index": 1, "crud_suitable": "true", "reason": ["lists", "too"]}]}),
                       ClassifierAnswer)
    assert [(r.index, r.crud_suitable) for r in ans.results] == [(0, False), (1, True)]
    assert ans.results[1].reason == '["lists", "too"]'
    for bad in ({"results": [{"index": "first", "crud_suitable": True}]},
                {"results": [{"index": 0, "crud_suitable": "maybe"}]},
                {"results": "none"}):
        with pytest.raises(ParseError, match="requested shape"):
            parse_answer(_j(bad), ClassifierAnswer)


def test_solution_answers_and_fix_targets() -> None:
    sol = parse_answer(_j({"solution": [{"tool": "get_book", "arguments": None}], "final_answer": 42}), SolutionAnswer)
    assert sol.solution[0].arguments == {} and sol.final_answer == "42"
    with pytest.raises(ParseError):
        parse_answer(_j({"solution": [{"tool": "get_book", "arguments": "book_id=2"}]}), SolutionAnswer)
    assert fix_target({"fix_target": " Data "}) == "data"
    assert fix_target({"fix_target": "the verifier"}) is None and fix_target({"fix_target": 3}) is None


async def test_classifier_saying_false_as_a_string_rejects(mock_openai: MockOpenAI, tmp_path: Path) -> None:
    cands = [{"name": "Daily Herald", "description": "A news site people read."},
             {"name": "Shelfie", "description": "Lend books to friends and track returns."}]
    mock_openai.script(_j({"scenarios": cands}), stage="scenario", repeat=True)
    mock_openai.script(_j({"results": [{"index": 0, "crud_suitable": "false", "category": "news", "reason": "read-only"},
                                       {"index": 1, "crud_suitable": "true", "category": "library", "reason": "crud"}]}),
                       stage="scenario.classify", repeat=True)
    out = await run_scenarios(mock_openai, tmp_path, target_count=1, embedder="none", max_rounds=2)
    assert [r["source_name"] for r in read_jsonl(out / "gen_scenario.jsonl")] == ["Shelfie"]
    herald = [r for r in read_jsonl(out / "synth_report.jsonl") if r["details"].get("source_name") == "Daily Herald"]
    assert herald and not herald[0]["ok"] and "not CRUD-suitable" in herald[0]["errors"][0]


async def test_a_malformed_classifier_index_is_an_unusable_round(mock_openai: MockOpenAI, tmp_path: Path) -> None:
    mock_openai.script(_j({"scenarios": [{"name": "Shelfie", "description": "Lend books to friends."}]}),
                       stage="scenario", repeat=True)
    mock_openai.script(_j({"results": [{"index": "first", "crud_suitable": True, "category": "library"}]}),
                       _j({"results": [{"index": 0, "crud_suitable": True, "category": "library"}]}),
                       stage="scenario.classify", repeat=True)
    out = await run_scenarios(mock_openai, tmp_path, target_count=1, embedder="none", max_rounds=3)
    assert [r["name"] for r in read_jsonl(out / "gen_scenario.jsonl")] == ["library_1"]
    report = read_jsonl(out / "synth_report.jsonl")
    round0 = [r for r in report if r["scenario"] == "_round_0"]
    assert round0 and "unusable LLM answer" in round0[0]["errors"][0] and "index" in round0[0]["errors"][0]


@pytest.mark.slow
def test_malformed_sample_and_spec_answers_are_repaired(tmp_path: Path) -> None:
    out = _one_scenario(tmp_path, "library_1", library)
    bad_sample = [{**t, "insert_statements": None} if t["table_name"] == "loans" else t for t in library.SAMPLE]
    bad_spec = {**library.SPEC, "api_groups": [{"group_name": "Books", "endpoints": {"search_books": {}}}]}
    with MockOpenAI() as mock:
        mock.script(_j({"tables": bad_sample}), stage="sample", scenario="library_1")
        mock.script(_j(bad_spec), stage="spec", scenario="library_1")
        script_pipeline(mock, broken=False)
        result = _run(mock, out)
        assert result.exit_code == 0, result.output
    rep = _report(out)
    for stage in ("sample", "spec"):
        rec = rep[(stage, "library_1", None)]
        assert rec["ok"] and rec["attempts"] == 2, rec
    assert json.loads((out / "gen_sample.jsonl").read_text())["inserts_count"] == 8
