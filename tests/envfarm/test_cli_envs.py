from __future__ import annotations

import json

from typer.testing import CliRunner

from cluster.cli import app

runner = CliRunner()


def test_envs_list_reports_servability(awm_samples):
    res = runner.invoke(app, ["envs", "list", str(awm_samples), "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert rows["content_platform_1"]["servable"] and not rows["marketplace_1"]["servable"]


def test_envs_show_lists_tools_and_tasks(awm_samples):
    res = runner.invoke(app, ["envs", "show", "Content Platform 1", str(awm_samples), "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert shown["name"] == "content_platform_1" and len(shown["tools"]) == 34
    assert len(shown["tasks"]) == 10


def test_envs_check_json_on_awm_samples(awm_samples):
    res = runner.invoke(app, ["envs", "check", str(awm_samples), "--json"])
    assert res.exit_code == 0, res.output
    reports = {r["name"]: r for r in json.loads(res.output)}
    for key in ("name", "tables", "rows", "tools", "tasks", "solvable", "problems"):
        assert key in reports["content_platform_1"]
    assert reports["content_platform_1"]["tools"] == 34 and reports["content_platform_1"]["rows"] == 154
    assert not reports["marketplace_1"]["loaded"]


def test_envs_check_exits_nonzero_when_an_env_fails_to_load(tmp_path):
    (tmp_path / "gen_envs.jsonl").write_text(json.dumps(
        {"scenario": "Broken Env", "db_path": "x.db", "full_code": "import not_a_real_module\n"}) + "\n")
    res = runner.invoke(app, ["envs", "check", str(tmp_path), "--json"])
    assert res.exit_code == 1
    report = json.loads(res.output)[0]
    assert report["name"] == "broken_env" and not report["loaded"]
    assert any("No module named 'not_a_real_module'" in p for p in report["problems"])


def test_unknown_catalog_or_env_is_a_clear_error(tmp_path, awm_samples):
    res = runner.invoke(app, ["envs", "list", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = runner.invoke(app, ["envs", "show", "nope", str(awm_samples)])
    assert res.exit_code == 2 and "no environment 'nope'" in res.output
