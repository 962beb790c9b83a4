"""Stage building blocks: SQL execution with attribution, spec validation, answer parsing, CLI errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from synth._parse import ParseError, extract_code, extract_json
from synth._sql import run_ddl, run_inserts
from synth.cli import app
from synth.stages.spec import validate_spec
from tests.fakes.synth_fixtures import library, recipes


def test_run_ddl_keeps_good_tables_and_names_the_failed_one() -> None:
    run = run_ddl(library.TABLES_BROKEN)
    assert run.failed_tables == ["loans"]
    assert run.failure_rate == pytest.approx(1 / 3)
    assert [t["name"] for t in run.kept] == ["users", "books"]
    assert any("loans" in e for e in run.errors)
    good = run_ddl(library.TABLES)
    assert good.failure_rate == 0 and len(good.kept[1]["indexes"]) == 2


def test_run_inserts_in_fk_order_and_reports_wrong_column_counts() -> None:
    reversed_tables = list(reversed(library.SAMPLE))  # children first: FK order must fix it
    run = run_inserts(library.TABLES, reversed_tables)
    assert run.failed == 0 and run.rows == 8
    bad = run_inserts(recipes.TABLES, recipes.SAMPLE_BROKEN)
    assert bad.failure_rate > 0.1
    assert any("values for" in e for e in bad.errors)  # sqlite: "N values for M columns"
    kept = {t["table_name"]: t["insert_statements"] for t in bad.kept}
    assert kept["recipes"] == [] and len(kept["users"]) == 1


def test_validate_spec_checks_shape_and_task_coverage() -> None:
    tables = {t["name"] for t in library.TABLES}
    errors, coverage = validate_spec(library.SPEC, 3, tables)
    assert errors == [] and coverage["0"] == ["search_books", "lend_book"]
    broken = {"api_groups": [{"group_name": "x", "endpoints": [
        {"path": "/api/books/{id}", "method": "FETCH", "operation_id": "Get Book", "request_params": {},
         "response": {}, "required_tables": ["shelves"]}]}], "task_coverage": {"0": ["nope"]}}
    errors, _ = validate_spec(broken, 2, tables)
    text = " ".join(errors)
    for needle in ("snake_case", "method", "placeholder {id}", "shelves", "undefined operation ids", "task 1 is not covered"):
        assert needle in text


def test_extract_json_and_code_from_chatty_answers() -> None:
    assert extract_json('Sure!\n```json\n{"a": 1}\n```') == {"a": 1}
    assert extract_json('noise {"a": {"b": 2}} trailing') == {"a": {"b": 2}}
    with pytest.raises(ParseError):
        extract_json('{"tasks": ["unterminated')
    assert extract_code("text\n```python\nx = 1\n```\n") == "x = 1\n"
    with pytest.raises(ParseError):
        extract_code("```python\nx = 1\n")


def test_cli_without_endpoint_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ENVFARM_LLM_BASE_URL", "ENVFARM_LLM_MODEL", "ENVFARM_LLM_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    res = CliRunner().invoke(app, ["task", "--out", str(tmp_path), "--no-progress"])
    assert res.exit_code == 2
    assert "no LLM endpoint configured" in res.output and "Traceback" not in res.output


def test_report_refuses_a_missing_folder(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["report", "--out", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "not a run folder" in res.output
