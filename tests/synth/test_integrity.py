"""Issue 12 §3: the acceptance gate and synth tell the truth.

- ``--no-gate`` tasks are counted apart (unverified), never as solvable;
- a tool that fails every schema-valid probe is a defect: repaired, or accepted and counted;
- sql-mode verifiers are run on the solved episode and must give the judge usable facts;
- reference solutions carry a final answer, so read-only tasks can pass;
- every stage takes only the CLI options that apply to it.

Pipelines run against the real mock OpenAI server with the recorded fixture answers.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envfarm import load_catalog
from envfarm.check import check_env, check_solution, probe_tools
from envfarm.models import ToolCall
from judge import VerifierSandbox
from synth._jsonl import read_jsonl
from synth._probe import load_runtime, make_bundle
from synth.cli import app
from tests.fakes.mock_openai import MockOpenAI
from tests.fakes.synth_fixtures import library, recipes
from tests.fakes.scripted_synth import _fenced, _j, _verifier_answer, script_pipeline

# return_loan compares with the wrong case: every call answers 400 "loan N is not active".
ENV_RETURN_ALWAYS_400 = library.ENV_CODE.replace('if loan.status != "active":', 'if loan.status != "ACTIVE":')
assert ENV_RETURN_ALWAYS_400 != library.ENV_CODE

# A read-only task in place of recipes' task 2: solvable only with the final answer.
READ_ONLY_TASK = "How many minutes does my 'Green Curry' recipe take to cook? Tell me the number."
READ_ONLY_CODE = '''\
def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    import sqlite3

    conn = sqlite3.connect(f"file:{final_db_path}?mode=ro", uri=True)
    minutes = conn.execute("SELECT minutes FROM recipes WHERE title = 'Green Curry'").fetchone()[0]
    conn.close()
    return {"result": "complete" if final_answer and str(minutes) in final_answer else "others"}
'''
# The same, exact: the minutes stated, and no other recipe's (an answer listing them all fails).
READ_ONLY_EXACT = READ_ONLY_CODE.replace(
    '''    minutes = conn.execute("SELECT minutes FROM recipes WHERE title = 'Green Curry'").fetchone()[0]
    conn.close()
    return {"result": "complete" if final_answer and str(minutes) in final_answer else "others"}''',
    '''    import re

    minutes = conn.execute("SELECT minutes FROM recipes WHERE title = 'Green Curry'").fetchone()[0]
    others = {m for (m,) in conn.execute("SELECT minutes FROM recipes") if m != minutes}
    conn.close()
    said = {int(n) for n in re.findall(r"\\b\\d+\\b", final_answer or "")}
    return {"result": "complete" if minutes in said and not said & others else "others"}''')
assert READ_ONLY_EXACT != READ_ONLY_CODE
READ_ONLY_SQL = '''\
def verify_task(initial_db_path: str, final_db_path: str) -> dict:
    import sqlite3

    conn = sqlite3.connect(f"file:{final_db_path}?mode=ro", uri=True)
    row = conn.execute("SELECT title, minutes FROM recipes WHERE title = 'Green Curry'").fetchone()
    conn.close()
    return {"recipe": list(row) if row else None}
'''
# An sql-mode verifier whose output never depends on the episode: useless to the LLM judge.
SQL_BLIND = '''\
def verify_task(initial_db_path: str, final_db_path: str) -> dict:
    return {"checked": True}
'''


def _scenario_record(name: str, fx: object) -> dict:
    scen = fx.SCENARIO  # type: ignore[attr-defined]
    return {"name": name, "description": scen["description"], "category": scen["category"],
            "source_name": scen["name"], "crud_suitable": True}


def _run(mock: MockOpenAI, out: Path, *extra: str) -> object:
    return CliRunner().invoke(app, [
        "all", "--out", str(out), "--llm-base-url", mock.url, "--llm-model", "mock", "--llm-api-key", "k",
        "--target-count", "1", "-k", "3", "--embedder", "none", "--no-progress", *extra])


def _one_scenario(tmp_path: Path, name: str, fx: object) -> Path:
    out = tmp_path / "run"
    out.mkdir()
    (out / "gen_scenario.jsonl").write_text(json.dumps(_scenario_record(name, fx)) + "\n")
    return out


def _report(out: Path) -> dict[tuple, dict]:
    return {(r["stage"], r["scenario"], r.get("task_idx")): r for r in read_jsonl(out / "synth_report.jsonl")}


def _table2(out: Path) -> dict[str, dict]:
    res = CliRunner().invoke(app, ["report", "--out", str(out), "--json"])
    return {r["env"]: r for r in json.loads(res.output)["table2"]}


# -- --no-gate ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_no_gate_tasks_are_unverified_not_solvable(tmp_path: Path) -> None:
    out = _one_scenario(tmp_path, "recipes_1", recipes)
    with MockOpenAI() as mock:
        script_pipeline(mock, broken=False)
        result = _run(mock, out, "--no-gate")
        assert result.exit_code == 0, result.output
        assert not mock.requests_for(stage="gate", scenario="recipes_1")  # no reference solution asked
    row = _table2(out)["recipes_1"]
    assert row["solvable_tasks"] == 0 and row["unverified_tasks"] == 3 and row["gated_tasks"] == 0
    gate = {r["stage"]: r for r in json.loads(
        CliRunner().invoke(app, ["report", "--out", str(out), "--json"]).output)["table1"]}["gate"]
    assert gate["skipped"] == 3 and gate["runs"] == 0
    assert "0 with solvable tasks, 1 with unverified tasks" in result.output
    assert "3 task(s) unverified" in CliRunner().invoke(app, ["report", "--out", str(out)]).output

    # A gated run over the same folder checks what the --no-gate run left unverified.
    with MockOpenAI() as mock:
        script_pipeline(mock, broken=False)
        again = _run(mock, out)
        assert again.exit_code == 0, again.output
        assert mock.requests_for(stage="gate", scenario="recipes_1")
    row = _table2(out)["recipes_1"]
    assert row["solvable_tasks"] == 3 and row["unverified_tasks"] == 0 and row["gated_tasks"] == 3
    assert "(1 with solvable tasks)" in again.output and "task(s) unverified" not in again.output
    for name in ("gen_verifier.jsonl", "gen_verifier.pure_code.jsonl", "gen_solutions.jsonl"):
        assert sorted(r["task_idx"] for r in read_jsonl(out / name)) == [0, 1, 2], name
    assert all(r["ok"] for k, r in _report(out).items() if k[0] == "gate")


# -- tools that always answer 4xx -----------------------------------------------------------------
def _library_runtime(code: str):
    bundle = make_bundle("library_1", db={"db_schema": {"tables": library.TABLES}},
                         sample={"sample_data": {"tables": library.SAMPLE}}, spec={"api_spec": library.SPEC}, code=code)
    runtime, err = load_runtime(bundle, 5.0)
    assert runtime is not None, err
    return runtime


def test_the_prober_calls_a_tool_that_fails_every_probe_a_defect() -> None:
    bad = asyncio.run(probe_tools(_library_runtime(ENV_RETURN_ALWAYS_400)))
    assert bad.errors == [] and bad.defective_tools == ["return_loan"] and "not active" in bad.defects[0]
    tried = [c for c in bad.calls if c["tool"] == "return_loan"]
    assert len(tried) > 1 and not any(c["ok"] for c in tried)  # several schema-valid argument sets
    good = asyncio.run(probe_tools(_library_runtime(library.ENV_CODE)))
    assert good.errors == [] and good.defects == []


@pytest.mark.slow
def test_env_stage_repairs_a_tool_that_always_answers_4xx(tmp_path: Path) -> None:
    out = _one_scenario(tmp_path, "library_1", library)
    with MockOpenAI() as mock:
        mock.script(_fenced(ENV_RETURN_ALWAYS_400), stage="env", scenario="library_1")
        script_pipeline(mock, broken=False)
        result = _run(mock, out)
        assert result.exit_code == 0, result.output
        assert mock.requests_for(stage="env.fix", scenario="library_1")  # the defect was summarized
    env = _report(out)[("env", "library_1", None)]
    assert env["ok"] and env["attempts"] == 2 and env["details"]["defects"] == 0
    assert read_jsonl(out / "gen_envs.jsonl")[0]["full_code"] == library.ENV_CODE.strip() + "\n"


@pytest.mark.slow
def test_env_stage_records_a_defect_it_could_not_repair(tmp_path: Path) -> None:
    out = _one_scenario(tmp_path, "library_1", library)
    with MockOpenAI() as mock:
        mock.script(_fenced(ENV_RETURN_ALWAYS_400), stage="env", scenario="library_1", repeat=True)
        script_pipeline(mock, broken=False)
        result = _run(mock, out)
        assert result.exit_code == 0, result.output
    env = _report(out)[("env", "library_1", None)]
    assert env["ok"] and env["attempts"] == 2  # one repair round, then accepted with the defect
    assert env["details"]["defects"] == 1 and env["details"]["defective_tools"] == ["return_loan"]
    assert "return_loan" in " ".join(env["errors"])
    assert _table2(out)["library_1"]["tool_defects"] == 1


# -- sql-mode verifiers and final answers, checked on the reference solution ----------------------
def _recipes_runtime():
    bundle = make_bundle("recipes_1", db={"db_schema": {"tables": recipes.TABLES}},
                         sample={"sample_data": {"tables": recipes.SAMPLE}}, spec={"api_spec": recipes.SPEC},
                         code=recipes.ENV_CODE)
    runtime, err = load_runtime(bundle, 5.0)
    assert runtime is not None, err
    return runtime


def test_check_solution_runs_the_sql_verifier_and_passes_the_final_answer() -> None:
    runtime = _recipes_runtime()
    sol = [ToolCall.model_validate(c) for c in recipes.SOLUTIONS[0]]
    read = [ToolCall(tool="list_recipes", arguments={"query": "Green Curry"})]

    async def main() -> None:
        with VerifierSandbox(workers=2) as sb:
            good = await check_solution(runtime, recipes.VERIFIERS[0]["code"], sol, sb,
                                        sql_verifier=recipes.VERIFIERS[0]["sql"])
            assert good.solvable and good.sql_usable and good.problems == []
            blind = await check_solution(runtime, recipes.VERIFIERS[0]["code"], sol, sb, sql_verifier=SQL_BLIND)
            assert not blind.solvable and blind.sql_usable is False
            assert "cannot tell them apart" in " ".join(blind.problems)
            broken = await check_solution(runtime, recipes.VERIFIERS[0]["code"], sol, sb,
                                          sql_verifier="def verify_task(a, b):\n    return 1 / 0\n")
            assert broken.sql_usable is False and "sql-mode verifier failed" in " ".join(broken.problems)
            answered = await check_solution(runtime, READ_ONLY_CODE, read, sb, sql_verifier=READ_ONLY_SQL,
                                            final_answer="It takes 40 minutes.")
            assert answered.solvable and answered.noop_result == "others", answered
            silent = await check_solution(runtime, READ_ONLY_CODE, read, sb)
            assert not silent.solvable and silent.solution_result == "others"

    asyncio.run(main())


@pytest.mark.slow
def test_gate_regenerates_an_sql_verifier_the_judge_cannot_use(tmp_path: Path) -> None:
    out = _one_scenario(tmp_path, "recipes_1", recipes)
    with MockOpenAI() as mock:
        mock.script(_verifier_answer(SQL_BLIND, recipes.VERIFIERS[0]["code"]), stage="verifier",
                    scenario="recipes_1", match=lambda r: recipes.TASKS[0] in r.prompt)
        script_pipeline(mock, broken=False)
        result = _run(mock, out)
        assert result.exit_code == 0, result.output
    gate = _report(out)[("gate", "recipes_1", 0)]
    assert gate["ok"] and gate["attempts"] == 2 and "sql-mode" in " ".join(gate["errors"])
    sql = {r["task_idx"]: r["verification"]["code"] for r in read_jsonl(out / "gen_verifier.jsonl")}
    assert sql[0] == recipes.VERIFIERS[0]["sql"]


@pytest.mark.slow
def test_gate_accepts_a_read_only_task_on_its_final_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first verifier passes an answer that merely contains 40: the hack probes' dump of
    every read value does, so the gate sends it back (issue 32); the exact one is accepted."""
    tasks = [*recipes.TASKS[:2], READ_ONLY_TASK]
    monkeypatch.setattr(recipes, "TASKS", tasks)
    monkeypatch.setattr(recipes, "VERIFIERS", {**recipes.VERIFIERS, 2: {"sql": READ_ONLY_SQL, "code": READ_ONLY_CODE}})
    out = _one_scenario(tmp_path, "recipes_1", recipes)
    with MockOpenAI() as mock:
        mock.script(_j({"solution": [{"tool": "list_recipes", "arguments": {"query": "Green Curry"}}],
                        "final_answer": "Green Curry takes 40 minutes."}),
                    stage="gate", scenario="recipes_1", repeat=True, match=lambda r: f"Task: {READ_ONLY_TASK}" in r.prompt)
        mock.script(_verifier_answer(READ_ONLY_SQL, READ_ONLY_CODE), _verifier_answer(READ_ONLY_SQL, READ_ONLY_EXACT),
                    stage="verifier", scenario="recipes_1", repeat=True, match=lambda r: READ_ONLY_TASK in r.prompt)
        script_pipeline(mock, broken=False)
        result = _run(mock, out)
        assert result.exit_code == 0, result.output
    gate = _report(out)[("gate", "recipes_1", 2)]
    assert gate["ok"] and gate["attempts"] == 2 and gate["details"]["final_answer"], gate
    assert "rewards a hack" in gate["errors"][0] and "dump" in gate["errors"][0]
    code = {r["task_idx"]: r["verification"]["code"] for r in read_jsonl(out / "gen_verifier.pure_code.jsonl")}
    assert "_verify_unguarded" in code[2] and READ_ONLY_EXACT.strip() in code[2].replace(
        "def _verify_unguarded(", "def verify_task_completion(")  # guarded: the exact check, wrapped
    sols = {r["task_idx"]: r for r in read_jsonl(out / "gen_solutions.jsonl")}
    assert sols[2]["final_answer"] == "Green Curry takes 40 minutes." and sols[0]["final_answer"] is None

    # The farm's catalog carries the answer, and the conformance checker passes it on.
    bundle = load_catalog(out)["recipes_1"]
    assert bundle.solution_answers == {2: "Green Curry takes 40 minutes."}
    with VerifierSandbox(workers=1) as sandbox:
        report = asyncio.run(check_env(bundle, sandbox))
    assert report.solvable == 3, report.problems


# -- per-stage CLI options ------------------------------------------------------------------------
@pytest.mark.parametrize(("stage", "flag", "owners"), [
    ("db", "--no-gate", "verifier, all"),
    ("scenario", "--max-attempts", "task, db, sample, spec, env, verifier, all"),
    ("verifier", "--target-count", "scenario, all"),
    ("env", "-k", "task, all"),
    ("task", "--seed-file", "scenario, all"),
    ("spec", "--embedder", "scenario, all"),
])
def test_a_stage_rejects_options_that_do_not_apply(tmp_path: Path, stage: str, flag: str, owners: str) -> None:
    value = [] if flag.startswith("--no-") else ["3"]
    res = CliRunner().invoke(app, [stage, "--out", str(tmp_path), flag, *value])
    text = " ".join(re.sub("[│╭╮╰╯─]", " ", res.output).split())  # unwrap rich's error box
    assert res.exit_code == 2
    assert f"{flag} does not apply to the '{stage}' stage; it is an option of: {owners}" in text, text


def test_options_that_apply_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ENVFARM_LLM_BASE_URL", "ENVFARM_LLM_MODEL", "ENVFARM_LLM_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    for args in (["verifier", "--no-gate", "--concurrency", "2"], ["scenario", "--target-count", "3"],
                 ["task", "-k", "3", "--max-attempts", "2"], ["all", "--no-gate", "--target-count", "2", "-k", "2"]):
        res = CliRunner().invoke(app, [*args, "--out", str(tmp_path), "--no-progress"])
        assert res.exit_code == 2 and "no LLM endpoint configured" in res.output, (args, res.output)
