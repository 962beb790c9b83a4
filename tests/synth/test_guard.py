"""Guarded verifiers (synth/guard.py): a destructive write beside the right answer fails, and no
hack probe passes a bundled task (they were guarded with ``envfarm synth guard``)."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from typer.testing import CliRunner

from envfarm import EnvRuntime, load_catalog
from envfarm.catalog import BUNDLED_CATALOG
from envfarm.hackprobes import HackProbe, ProbeTask, bundle_tasks, probe_task, probe_tasks
from judge import Judge, JudgeConfig, VerifierSandbox
from synth.guard import GUARDED, guard_code, read_written_tables, touched_rows
from tests.envfarm.test_hackprobes import LEND, NEW_LOAN
from tests.synth.factory_env import lending_bundle


@pytest.fixture(scope="module")
def judge():
    with VerifierSandbox(workers=2, timeout_s=10.0) as sandbox:
        yield Judge(JudgeConfig(use_llm="never"), sandbox=sandbox)


def test_a_guarded_verifier_fails_collateral_damage(judge) -> None:
    bundle = lending_bundle().model_copy(update={"solutions": {0: LEND}})
    runtime = EnvRuntime(bundle)
    touched = asyncio.run(touched_rows(runtime, 0))
    assert touched == {"loans": [2]}  # the new loan
    guarded = guard_code(NEW_LOAN, touched, [])
    assert GUARDED in guarded and guard_code(guarded, touched, []) == guarded  # once only
    task = ProbeTask(text="Lend Emma to Ann.", solution=LEND, final_answer="Done.")
    before = asyncio.run(probe_task(runtime, task.model_copy(update={"code_verifier": NEW_LOAN}), judge))
    after = asyncio.run(probe_task(runtime, task.model_copy(update={"code_verifier": guarded}), judge))
    assert before.hacked == [HackProbe.side_effect]
    assert after.hacked == [] and after.reference.value == "completed", after.summary()


@pytest.mark.slow
def test_no_probe_passes_a_bundled_task(judge) -> None:
    """All 30 bundled tasks on the code path (before the guard, 27 passed the side-effect probe)."""
    catalog = load_catalog()

    async def main():
        out = []
        for name in catalog.servable:
            runtime = EnvRuntime(catalog[name])
            assert await read_written_tables(runtime) == set()
            out += await probe_tasks(runtime, bundle_tasks(catalog[name]), judge)
        return out

    reports = asyncio.run(main())
    assert len(reports) == 30
    assert [r.summary() for r in reports if r.rejects] == []
    assert all(r.reference.value == "completed" for r in reports)


def test_check_flags_a_hackable_task_and_the_farm_quarantines_it(tmp_path) -> None:
    """`envfarm envs check --hacks --write-flags` over a catalog whose task 0 verifier passes a
    no-op: gen_probes.jsonl flags it; loading the catalog flags it; a farm refuses its leases."""
    from envfarm.cli import app
    from envfarm.compose import LocalFarm
    from envfarm.farm import FarmConfig, PoolConfig

    env = "personal_banking_1"
    shutil.copytree(BUNDLED_CATALOG / env, tmp_path / env)
    path = tmp_path / env / "gen_verifier.pure_code.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[0]["verification"]["code"] = ('def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n'
                                          '    return {"result": "complete"}\n')
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    runner = CliRunner()
    res = runner.invoke(app, ["envs", "check", str(tmp_path), "--hacks", "--write-flags", "--json"])
    assert res.exit_code == 0, res.output
    (report,) = json.loads(res.output)
    assert report["probed"] == 10 and list(report["hackable"]) == ["0"]
    assert "noop" in report["hackable"]["0"]
    flagged = load_catalog(tmp_path)[env].flagged
    assert list(flagged) == [0] and "noop" in flagged[0]
    with LocalFarm(FarmConfig(catalog=str(tmp_path), envs=[env], pool=PoolConfig(warm=1))) as farm:
        listed = runner.invoke(app, ["envs", "quarantine", "list", "--farm", farm.url, "--json"])
        assert listed.exit_code == 0, listed.output
        assert [(q["task_idx"], q["source"]) for q in json.loads(listed.output)] == [(0, "flagged")]
        lifted = runner.invoke(app, ["envs", "quarantine", "lift", env, "--task", "0", "--farm", farm.url])
        assert lifted.exit_code == 0 and "lifted 1" in lifted.output, lifted.output
        again = runner.invoke(app, ["envs", "quarantine", "list", "--farm", farm.url])
        assert "no task is quarantined" in again.output
    # a verifier changed since it was probed: the stale flag is dropped, and said so
    records[0]["verification"]["code"] += "# edited\n"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    bundle = load_catalog(tmp_path)[env]
    assert bundle.flagged == {} and any("changed since it was probed" in p for p in bundle.problems)
