from __future__ import annotations

import json

import pytest

from envfarm import load_catalog, normalize_name
from envfarm.errors import CatalogError, EnvNotFound


def test_awm_samples_load_unchanged_with_problems_reported(awm_catalog):
    assert set(awm_catalog.names) == {
        "content_platform_1", "code_hosting_2", "communication_messaging_1", "e_commerce_33",
        "marketplace_1", "booking_marketplace_1", "booking_and_appointments_1"}
    assert awm_catalog.servable == ["code_hosting_2", "communication_messaging_1",
                                    "content_platform_1"]
    cp = awm_catalog["content_platform_1"]
    assert len(cp.tasks) == 10 and len(cp.db_schema.tables) == 14
    assert sum(len(t.insert_statements) for t in cp.sample_data.tables) == 154
    ecom = awm_catalog["e_commerce_33"]
    assert sorted(ecom.verifiers) == [0, 1, 2] and sorted(ecom.code_verifiers) == [0, 1, 2]
    assert any("sql verifier of task 2: syntax error" in p for p in ecom.problems)
    assert "verify_task_completion" in ecom.code_verifiers[0].code
    assert ecom.verifiers[0].criteria["function_name"] == "verify_task"
    comm = awm_catalog["communication_messaging_1"]
    assert any("code but no schema" in p for p in comm.problems)
    assert any("cannot be served" in p for p in awm_catalog["marketplace_1"].problems)


@pytest.mark.parametrize("raw,expected", [
    ("Content Platform 1", "content_platform_1"),
    ("e-commerce/33", "e_commerce_33"),
    ("  GitHub++ ", "github"),
    ("already_normal_2", "already_normal_2"),
])
def test_normalize_name(raw, expected):
    assert normalize_name(raw) == expected


def test_lookup_normalizes_and_unknown_is_typed(awm_catalog):
    assert awm_catalog["Content Platform 1"].name == "content_platform_1"
    with pytest.raises(EnvNotFound, match="no environment 'nope'"):
        awm_catalog["nope"]


def test_broken_records_do_not_stop_the_catalog(tmp_path):
    (tmp_path / "gen_scenario.jsonl").write_text(
        json.dumps({"name": "Good One", "description": "fine"}) + "\n"
        + "{not json\n"
        + json.dumps([1, 2]) + "\n"
        + json.dumps({"description": "no name"}) + "\n")
    (tmp_path / "gen_tasks.jsonl").write_text(
        json.dumps({"scenario": "good_one", "tasks": ["a", "b"]}) + "\n"
        + json.dumps({"scenario": "bad_tasks", "tasks": 5}) + "\n")
    cat = load_catalog(tmp_path)
    assert cat["good_one"].tasks == ["a", "b"]
    assert any("gen_scenario.jsonl:2: not JSON" in p for p in cat.problems)
    assert any("gen_scenario.jsonl:3: not a JSON object" in p for p in cat.problems)
    assert any("without a scenario name" in p for p in cat.problems)
    assert any("malformed record" in p for p in cat["bad_tasks"].problems)


def test_missing_or_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(CatalogError, match="does not exist"):
        load_catalog(tmp_path / "nope")
    with pytest.raises(CatalogError, match="holds no AWM files"):
        load_catalog(tmp_path)
