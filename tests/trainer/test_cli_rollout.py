"""`envfarm rollout` evaluates an OpenAI-compatible endpoint (the local mock) on the catalog."""

from __future__ import annotations

import json
from collections import defaultdict

from typer.testing import CliRunner

from cluster.cli import app
from trainer.policy import ScriptedPolicy, TurnContext


def test_rollout_against_mock_openai(mock_openai, bundled_catalog, tmp_path):
    scripted = ScriptedPolicy.from_catalog(bundled_catalog)
    by_task = {task: (env, idx) for env in bundled_catalog.servable
               for idx, task in enumerate(bundled_catalog[env].tasks)}
    turns: dict[str, int] = defaultdict(int)

    def answer(req):
        """Plays the reference solution of the task in the request, like a perfect model; the
        endpoint only sees the (windowed) messages, so it counts turns per task itself."""
        task = req.messages[1]["content"]
        env, idx = by_task[task]
        if env == "project_management_1" and idx == 1:
            return "I refuse to use tags."  # a format error, counted as such
        ctx = TurnContext(env=env, task_idx=idx, task=task, turn=turns[task])
        turns[task] += 1
        return scripted.turn_text(ctx)

    mock_openai.script(answer, repeat=True)
    out = tmp_path / "rollouts.jsonl"
    res = CliRunner().invoke(app, ["rollout", "--base-url", mock_openai.url,
                                   "--model", "mock-qwen3", "--tasks", "0,1", "--out", str(out),
                                   "--concurrency", "4"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 6
    by = {(r["env"], r["task_idx"]): r for r in lines}
    bad = by.pop(("project_management_1", 1))
    assert (bad["outcome"], bad["reward"], bad["end"]) == ("format_error", -1.0, "format_error")
    assert all(r["success"] and r["reward"] == 1.0 for r in by.values()), by
    assert "83.3%" in res.output and "overall" in res.output
    seen = mock_openai.requests
    assert {r.model for r in seen} == {"mock-qwen3"}
    # tool answers reach the endpoint as user <tool_response> messages (Qwen3's own rendering)
    later = [r for r in seen if len(r.messages) > 3]
    assert later and later[0].messages[3]["role"] == "user"
    assert later[0].messages[3]["content"].startswith("<tool_response>")


def test_rollout_of_a_local_hf_checkpoint(tiny_model, tmp_path):
    """`--hf-model` runs a local checkpoint in process: the tiny random model's own episodes,
    with the listing the training config uses; every episode ends typed, none leaks."""
    out = tmp_path / "rollouts.jsonl"
    res = CliRunner().invoke(app, ["rollout", "--hf-model", str(tiny_model), "--envs",
                                   "personal_banking_1", "--tasks", "0,7", "--out", str(out),
                                   "--max-tokens", "8", "--max-turns", "2",
                                   "--tool-listing", "names", "--temperature", "0"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["task_idx"] for r in lines) == [0, 7]
    assert all(r["valid"] and r["reward"] == -1.0 for r in lines)  # random weights: format
    assert "overall" in res.output
    res = CliRunner().invoke(app, ["rollout", "--hf-model", str(tiny_model),
                                   "--tool-listing", "everything"])
    assert res.exit_code != 0 and "full, compact or names" in res.output
