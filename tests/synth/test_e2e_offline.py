"""The whole pipeline (`envfarm synth all`) offline against the scripted mock server.

Broken answers at every executable stage must be corrected, the gate must accept the good tasks
and drop the unsolvable one, and the result must load and serve in envfarm's runtime.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envfarm import EnvRuntime, load_catalog
from judge import VerifierSandbox
from synth._jsonl import read_jsonl
from synth.cli import app
from tests.fakes.mock_openai import MockOpenAI
from tests.fakes.scripted_synth import script_pipeline, write_seeds

pytestmark = pytest.mark.slow


def _run_all(mock: MockOpenAI, out: Path, seeds: Path, *extra: str) -> object:
    return CliRunner().invoke(app, [
        "all", "--out", str(out), "--llm-base-url", mock.url, "--llm-model", "mock", "--llm-api-key", "k",
        "--seed-file", str(seeds), "--target-count", "2", "-k", "3", "--embedder", "endpoint", "--no-progress",
        "--price", "mock=1000/2000", *extra,
    ])


def _report(out: Path) -> dict[tuple, dict]:
    return {(r["stage"], r["scenario"], r.get("task_idx")): r for r in read_jsonl(out / "synth_report.jsonl")}


def test_all_end_to_end_with_broken_answers(tmp_path: Path) -> None:
    out, seeds = tmp_path / "run", tmp_path / "seeds.jsonl"
    write_seeds(seeds)
    with MockOpenAI() as mock:
        script_pipeline(mock, broken=True)
        result = _run_all(mock, out, seeds, "--llm-record", str(tmp_path / "recording.jsonl"))
        assert result.exit_code == 0, result.output
        assert not mock.unmatched, [r.last_user[:200] for r in mock.unmatched]
        calls = len(mock.requests)

        # Scenario stage: the news site and the near-duplicate are rejected; two scenarios accepted.
        scen = {r["name"]: r for r in read_jsonl(out / "gen_scenario.jsonl")}
        assert set(scen) == {"library_1", "recipes_1"}
        rep = _report(out)
        rejected = [r for k, r in rep.items() if k[0] == "scenario" and not r["ok"]]
        reasons = " ".join(e for r in rejected for e in r["errors"])
        assert "not CRUD-suitable" in reasons and "near-duplicate" in reasons

        # Every self-correction loop converged after the broken first answers.
        assert rep[("task", "library_1", None)]["attempts"] == 2
        assert rep[("db", "library_1", None)]["attempts"] == 2
        assert rep[("sample", "recipes_1", None)]["attempts"] == 2
        assert rep[("env", "library_1", None)]["attempts"] == 3
        assert rep[("verifier", "recipes_1", 1)]["attempts"] == 2
        assert all(rep[(s, n, None)]["ok"] for s in ("task", "db", "sample", "spec", "env") for n in scen)
        assert len(mock.requests_for(stage="spec", scenario="recipes_1")) == 3  # 429, 500, then good
        assert mock.requests_for(stage="env.fix", scenario="library_1")  # errors were summarized by the LLM
        env_errors = " ".join(rep[("env", "library_1", None)].get("errors", []))
        assert env_errors == ""  # the accepted attempt had none

        # The gate: library task 2 has no tool that can do it -> dropped with reasons; recipes task 2's
        # verifier could not tell a no-op from success -> regenerated and accepted.
        drop = rep[("gate", "library_1", 2)]
        assert not drop["ok"] and "sell_book" in " ".join(drop["errors"])
        fixed = rep[("gate", "recipes_1", 2)]
        assert fixed["ok"] and fixed["attempts"] == 2 and "no-op" in " ".join(fixed["errors"])
        sols = {(r["scenario"], r["task_idx"]) for r in read_jsonl(out / "gen_solutions.jsonl")}
        assert sols == {("library_1", 0), ("library_1", 1), ("recipes_1", 0), ("recipes_1", 1), ("recipes_1", 2)}
        code_v = {(r["scenario"], r["task_idx"]) for r in read_jsonl(out / "gen_verifier.pure_code.jsonl")}
        assert code_v == sols

        # Cost accounting per stage: the price table was applied.
        assert sum(r["cost_usd"] for r in rep.values()) > 0

        # Re-running a finished run is free: no new LLM requests, no duplicated records.
        before = {f.name: f.read_text() for f in out.glob("*.jsonl")}
        again = _run_all(mock, out, seeds)
        assert again.exit_code == 0, again.output
        assert len(mock.requests) == calls
        assert {f.name: f.read_text() for f in out.glob("*.jsonl")} == before

    # The recording (chat and embeddings) replays the whole pipeline offline, no endpoint at all.
    replay_out = tmp_path / "replayed"
    replayed = CliRunner().invoke(app, [
        "all", "--out", str(replay_out), "--llm-replay", str(tmp_path / "recording.jsonl"), "--llm-model", "mock",
        "--no-cache", "--seed-file", str(seeds), "--target-count", "2", "-k", "3", "--embedder", "endpoint",
        "--no-progress"])
    assert replayed.exit_code == 0, replayed.output
    for name in ("gen_envs.jsonl", "gen_solutions.jsonl", "gen_verifier.pure_code.jsonl", "gen_sample.jsonl"):
        assert sorted(read_jsonl(replay_out / name), key=json.dumps) == sorted(read_jsonl(out / name), key=json.dumps)

    # The output is a catalog the farm loads and serves; reference solutions pass the verifiers.
    catalog = load_catalog(out)
    assert {"library_1", "recipes_1"} <= set(catalog.names)
    asyncio.run(_serve_and_verify(catalog))

    table = CliRunner().invoke(app, ["report", "--out", str(out)])
    assert table.exit_code == 0
    assert "Table 1" in table.output and "Table 2" in table.output and "library_1" in table.output
    t2 = json.loads(CliRunner().invoke(app, ["report", "--out", str(out), "--json"]).output)["table2"]
    by_env = {r["env"]: r for r in t2}
    assert by_env["library_1"]["solvable_tasks"] == 2 and by_env["recipes_1"]["solvable_tasks"] == 3
    assert by_env["recipes_1"]["tools"] == 5 and by_env["library_1"]["tables"] == 3


async def _serve_and_verify(catalog: object) -> None:
    sandbox = VerifierSandbox(workers=1)
    try:
        for name in ("library_1", "recipes_1"):
            bundle = catalog[name]
            runtime = EnvRuntime(bundle)
            assert runtime.tools
            for idx, solution in bundle.solutions.items():
                inst = runtime.instance()
                for call in solution:
                    res = await inst.call(call.tool, call.arguments)
                    assert res.ok, (name, idx, call, res.error)
                verdict = await sandbox.run(bundle.code_verifiers[idx].code, inst.initial_snapshot(), inst.snapshot())
                assert verdict.code_result == "complete", (name, idx, verdict)
                inst.close()
            assert Counter(type(k) for k in bundle.solutions) == Counter({int: len(bundle.solutions)})
    finally:
        sandbox.close()
