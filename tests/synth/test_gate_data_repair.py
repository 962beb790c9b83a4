"""The acceptance gate repairs sample data: a task that names a row the initial database lacks gets
its rows (run for real, re-checked against the tasks already accepted), and the run folder ends up
with the data in gen_sample.jsonl, loadable and servable by the farm with every task solvable."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envfarm import build_template, load_catalog
from envfarm.check import check_env
from envfarm.models import DBSchema, SampleData
from judge import VerifierSandbox
from synth._jsonl import read_jsonl
from synth._sql import run_inserts
from synth.cli import app
from synth.stages.sample import PATCH_FILE, merge_tables, run_extra_inserts
from tests.fakes.mock_openai import MockOpenAI, Reply
from tests.fakes.synth_fixtures import cookbook, recipes
from tests.fakes.scripted_synth import _fenced, _j, _verifier_answer
from tests.synth.test_resume_after_kill import KEYS, REPO, _run_until

NAME = cookbook.NAME


def _script(mock: MockOpenAI, *, break_task_1: bool = True) -> None:
    fx = cookbook
    mock.script(_j({"tasks": fx.TASKS}), stage="task", scenario=NAME, repeat=True)
    mock.script(_j({"tables": fx.TABLES}), stage="db", scenario=NAME, repeat=True)
    mock.script(_j({"tables": fx.SAMPLE_MISSING}), stage="sample", scenario=NAME, repeat=True)
    mock.script(_j(fx.SPEC), stage="spec", scenario=NAME, repeat=True)
    mock.script(_fenced(fx.ENV_CODE), stage="env", scenario=NAME, repeat=True)
    for idx, task in enumerate(fx.TASKS):
        v = fx.VERIFIERS[idx]
        mock.script(_verifier_answer(v["sql"], v["code"]), stage="verifier", scenario=NAME, repeat=True,
                    match=lambda r, t=task: t in r.prompt)
        mock.script(_j({"solution": fx.SOLUTIONS[idx]}), stage="gate", scenario=NAME, repeat=True,
                    match=lambda r, t=task: f"Task: {t}" in r.prompt)
    mock.script(_j({"root_cause": "Recipe 2 ('Banana Bread') does not exist in the initial data.",
                    "problem_code": "favorite_recipe(recipe_id=2) -> 404", "guidance": "Add the recipe row.",
                    "fix_target": "data"}), stage="gate.fix", scenario=NAME, repeat=True)
    # The second answer waits a little, so tasks 0 and 1 are surely accepted before it is checked.
    breaking = [Reply(text=_j({"tables": fx.ROWS_BREAK_TASK_1}), latency_s=0.3)] if break_task_1 else []
    mock.script(_j({"tables": fx.ROWS_BAD_FK}), *breaking, _j({"tables": fx.ROWS_GOOD}), stage="gate.data",
                scenario=NAME, repeat=True)
    mock.script(_j({"root_cause": "owner_id 99 is not a user", "problem_code": "VALUES (2, 99, ...)",
                    "guidance": "Use owner_id 1."}), stage="gate.data.fix", scenario=NAME, repeat=True)


def _run(mock: MockOpenAI, out: Path) -> object:
    return CliRunner().invoke(app, [
        "all", "--out", str(out), "--llm-base-url", mock.url, "--llm-model", "mock", "--llm-api-key", "k",
        "--target-count", "1", "-k", "3", "--embedder", "none", "--no-progress"])


def _report(out: Path) -> dict[tuple, dict]:
    return {(r["stage"], r["scenario"], r.get("task_idx")): r for r in read_jsonl(out / "synth_report.jsonl")}


@pytest.mark.slow
def test_gate_adds_missing_rows_and_keeps_accepted_tasks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "gen_scenario.jsonl").write_text(json.dumps(cookbook.SCENARIO) + "\n")
    with MockOpenAI() as mock:
        _script(mock)
        result = _run(mock, out)
        assert result.exit_code == 0, result.output
        assert not mock.unmatched, [r.last_user[:200] for r in mock.unmatched]
        calls = len(mock.requests)

        rep = _report(out)
        assert all(rep[("gate", NAME, i)]["ok"] for i in range(3))
        gate2 = rep[("gate", NAME, 2)]
        assert gate2["attempts"] == 3 and gate2["details"]["data_rows_added"] == 1
        assert "not found" in gate2["errors"][0]  # the first check: the recipe does not exist
        repair = rep[("data_repair", NAME, 2)]
        assert repair["ok"] and repair["attempts"] == 3 and repair["llm_calls"] == 4  # 3 answers + 1 summary
        assert repair["details"]["rows_added"] == 1 and repair["details"]["rechecked_tasks"] == [0, 1]
        why = " ".join(repair["errors"])
        assert "FOREIGN KEY" in why  # the first rows did not insert
        assert "break accepted tasks: task 1" in why and "no-op" in why  # the second broke task 1
        assert ("data_repair", NAME, 0) not in rep and ("data_repair", NAME, 1) not in rep

        # The patch is the commit; gen_sample.jsonl holds the folded result, one record, atomically written.
        patches = read_jsonl(out / PATCH_FILE)
        assert [(p["seq"], p["task_idx"], p["rows"]) for p in patches] == [(0, 2, 1)]
        samples = read_jsonl(out / "gen_sample.jsonl")
        assert len(samples) == 1 and samples[0]["data_repairs"] == [0] and samples[0]["inserts_count"] == 5
        stmts = [s for t in samples[0]["sample_data"]["tables"] for s in t["insert_statements"]]
        assert cookbook.BANANA in stmts and "'Tomato Soup', 6, 15" not in " ".join(stmts)
        assert not list(out.glob("*.tmp"))

        table = CliRunner().invoke(app, ["report", "--out", str(out)])
        assert "data_repair" in table.output
        t2 = json.loads(CliRunner().invoke(app, ["report", "--out", str(out), "--json"]).output)["table2"]
        assert t2[0]["rows_added_by_gate"] == 1 and t2[0]["solvable_tasks"] == 3 and t2[0]["sample_rows"] == 5

        # Re-running a finished run is free and changes nothing.
        before = {f.name: f.read_text() for f in out.glob("*.jsonl")}
        assert _run(mock, out).exit_code == 0
        assert len(mock.requests) == calls
        assert {f.name: f.read_text() for f in out.glob("*.jsonl")} == before

        # A kill between the commit (patch appended) and the rewrite: the next run folds it in, once.
        base = {**samples[0], "inserts_count": 4, "sample_data": {"tables": cookbook.SAMPLE_MISSING}}
        del base["data_repairs"]
        (out / "gen_sample.jsonl").write_text(json.dumps(base) + "\n")
        assert _run(mock, out).exit_code == 0
        assert len(mock.requests) == calls
        assert read_jsonl(out / "gen_sample.jsonl") == samples

    # The farm loads the folder and serves the env with every task solvable on the repaired data.
    bundle = load_catalog(out)[NAME]
    sandbox = VerifierSandbox(workers=1)
    try:
        env = asyncio.run(check_env(bundle, sandbox))
    finally:
        sandbox.close()
    assert env.loaded and env.rows == 5 and env.solvable == 3, env.problems


@pytest.mark.slow
def test_kill_9_around_a_data_repair_and_resume(tmp_path: Path) -> None:
    with MockOpenAI(latency_s=0.05) as mock:
        # Right after the repair's commit point, before the scenario's gen_sample.jsonl is rewritten;
        # a fresh run when the poller missed that window (it can, on a loaded machine).
        for attempt in range(3):
            mock.clear()
            _script(mock, break_task_1=False)
            out = tmp_path / f"run{attempt}"
            out.mkdir()
            (out / "gen_scenario.jsonl").write_text(json.dumps(cookbook.SCENARIO) + "\n")
            cmd = [sys.executable, "-m", "synth.cli", "all", "--out", str(out), "--llm-base-url", mock.url,
                   "--llm-model", "mock", "--target-count", "1", "-k", "3", "--embedder", "none",
                   "--no-progress"]
            if _run_until(cmd, out, PATCH_FILE, 1):
                break
        else:
            pytest.fail("three runs finished before the poller saw the repair's commit point")
        final = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
        assert final.returncode == 0, final.stderr[-3000:]
    for name, key in {**KEYS, PATCH_FILE: lambda r: (r["scenario"], r["seq"])}.items():
        records = [json.loads(line) for line in (out / name).read_text().splitlines()]
        assert len({json.dumps(key(r)) for r in records}) == len(records), name
    rep = _report(out)
    assert all(rep[("gate", NAME, i)]["ok"] for i in range(3))
    assert rep[("data_repair", NAME, 2)]["ok"] and rep[("data_repair", NAME, 2)]["details"]["rows_added"] == 1
    assert [p["seq"] for p in read_jsonl(out / PATCH_FILE)] == [0]
    (sample,) = read_jsonl(out / "gen_sample.jsonl")
    assert sample["data_repairs"] == [0] and sample["inserts_count"] == 5
    sandbox = VerifierSandbox(workers=1)
    try:
        env = asyncio.run(check_env(load_catalog(out)[NAME], sandbox))
    finally:
        sandbox.close()
    assert env.solvable == 3, env.problems


def test_extra_inserts_run_on_top_of_existing_data_all_or_nothing() -> None:
    base = run_inserts(recipes.TABLES, cookbook.SAMPLE_MISSING)
    assert base.failed == 0
    data = build_template(DBSchema.model_validate({"tables": recipes.TABLES}),
                          SampleData.model_validate({"tables": base.kept})).data
    # Children before parents: foreign-key order (and later passes) still get them in.
    fav = {"table_name": "favorites", "insert_statements": ["INSERT INTO favorites (user_id, recipe_id) VALUES (1, 2);"]}
    ok = run_extra_inserts(data, [fav, *cookbook.ROWS_GOOD])
    assert ok.errors == [] and ok.rows == 2
    assert any("FOREIGN KEY" in e for e in run_extra_inserts(data, cookbook.ROWS_BAD_FK).errors)
    clash = run_extra_inserts(data, [{"table_name": "recipes", "insert_statements": [
        "INSERT INTO recipes (id, owner_id, title, servings, minutes) VALUES (1, 1, 'Dup', 1, 1);"]}])
    assert any("UNIQUE" in e for e in clash.errors)
    sneaky = run_extra_inserts(data, [{"table_name": "recipes", "insert_statements": ["DELETE FROM recipes;"]}])
    assert any("not an INSERT" in e for e in sneaky.errors)
    assert run_extra_inserts(data, []).errors == ["no INSERT statements"]
    merged = merge_tables(cookbook.SAMPLE_MISSING, [fav, *cookbook.ROWS_GOOD])
    assert [t["table_name"] for t in merged] == ["users", "recipes", "favorites"]
    assert sum(len(t["insert_statements"]) for t in merged) == 6
    assert sum(len(t["insert_statements"]) for t in cookbook.SAMPLE_MISSING) == 4  # inputs untouched
