"""``envfarm judge FILE``: verdicts for a file of recorded episodes, in input order."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from judge.cli import judge_command


def test_judge_file(tmp_path, awm_cases, good_traj, traj, monkeypatch):
    monkeypatch.delenv("ENVFARM_LLM_BASE_URL", raising=False)
    case = awm_cases[1]
    (tmp_path / "initial.db").write_bytes(case.initial)
    (tmp_path / "solved.db").write_bytes(case.solved)
    verifier = {"code": case.code["code"]}
    lines = [
        {"id": "solved", "trajectory": good_traj.build().model_dump(), "verifier": verifier,
         "initial_db": "initial.db", "final_db": "solved.db"},
        {"id": "noop", "task": case.task, "verifier": verifier,
         "initial_db": "initial.db", "final_db": "initial.db"},
        {"id": "format", "trajectory": traj(case.task).final().build().model_dump(),
         "verifier": verifier, "initial_db": "initial.db", "final_db": "solved.db"},
        {"id": "broken", "task": case.task, "verifier": {"code": awm_cases[2].sql["code"]},
         "initial_db": "initial.db", "final_db": "solved.db"},
    ]
    src = tmp_path / "episodes.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n{not json}\n")

    app = typer.Typer()
    app.command()(judge_command)
    result = CliRunner().invoke(app, [str(src), "--workers", "1"])
    assert result.exit_code == 0, result.output

    out = [json.loads(x) for x in (tmp_path / "episodes.verdicts.jsonl").read_text().splitlines()]
    assert [o["id"] for o in out] == ["solved", "noop", "format", "broken", None]
    rewards = [o["verdict"]["reward"] for o in out]
    assert rewards == [1.0, 0.0, -1.0, None, None]
    assert out[3]["verdict"]["error_kind"] == "verifier_error"
    assert out[4]["verdict"]["outcome"] == "invalid"
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["outcomes"] == {"completed": 1, "agent_error": 1, "format_error": 1,
                                   "invalid": 2}
