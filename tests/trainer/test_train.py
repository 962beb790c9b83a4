"""`envfarm train`: GRPO steps on CPU with the tiny model against the embedded farm, metrics,
plot, checkpoints, and resuming after kill -9 (a real subprocess, really killed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trainer import checkpoint

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

#: As small as a run can be and still have GRPO signal: one task, G=2 (a reference replay
#: scoring 1.0 beside the random model's -1.0), short turns and prompts.
SMALL = {"envs": ["personal_banking_1"], "tasks": [0], "batch_size": 1, "group_size": 2,
         "guide_fraction": 0.5, "max_turns": 4, "max_new_tokens": 8, "max_tool_chars": 300,
         "tool_listing": "compact", "lr": 1e-3, "micro_batch": 4, "concurrency": 4,
         "threads": 1, "lr_decay_from": 1}


def _config(tmp_path: Path, steps: int) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({**SMALL, "steps": steps, "out_dir": str(tmp_path / "run")}))
    return path


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_three_steps_then_kill_9_and_resume(tmp_path, tiny_model):
    env = {**os.environ, "ENVFARM_CACHE": str(tiny_model.parents[1])}  # the built tiny model
    cmd = [sys.executable, "-m", "cluster.cli", "train", "--config", str(_config(tmp_path, 3)),
           "--no-ray"]
    run = tmp_path / "run"
    log = tmp_path / "first.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, stdout=sink,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while checkpoint.latest(run / "checkpoints") is None:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the trainer and everything it started
        proc.wait()
    killed_at = checkpoint.step_of(checkpoint.latest(run / "checkpoints"))
    assert killed_at < 2, "the run finished before it could be killed"

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    first = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert first["step"] == killed_at + 1  # continued at the next step, not from scratch
    assert _steps(run) == [0, 1, 2]
    assert checkpoint.step_of(checkpoint.latest(run / "checkpoints")) == 2
    assert (run / "plot.png").read_bytes()[:4] == b"\x89PNG"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # the optimizer's rate per step, across the kill: constant to step 1, then falling
    assert [r["lr"] for r in records] == pytest.approx([1e-3, 1e-3, 5e-4])
    for r in records:
        assert r["episodes"] == 2 and r["guided_episodes"] == 1
        assert r["model_reward_mean"] == -1.0  # the random model: format errors, honestly shown
        assert r["update_samples"] > 0 and r["groups_used"] == 1
        assert r["model_success_rate"] == 0.0 and r["success_rate"] == 0.0  # not the guide's
        assert r["guided_success_rate"] == 1.0 and r["model_format_error_rate"] == 1.0
        assert {"reward_std", "invalid_rate", "model_turns_mean", "guided_turns_mean",
                "tokens", "rollout_s", "update_s", "env_calls_per_s"} <= r.keys()


@pytest.mark.ray
def test_train_on_a_ray_trainer_actor(tmp_path, tiny_model, monkeypatch):
    from typer.testing import CliRunner

    from cluster.cli import app

    monkeypatch.setenv("ENVFARM_CACHE", str(tiny_model.parents[1]))
    config = _config(tmp_path, 1)
    # two steps in one start of Ray (resuming is test_train_three_steps_then_kill_9_and_resume's)
    res = CliRunner().invoke(app, ["train", "--config", str(config), "--steps", "2"])
    assert res.exit_code == 0, res.output
    assert _steps(tmp_path / "run") == [0, 1]
    assert checkpoint.step_of(checkpoint.latest(tmp_path / "run" / "checkpoints")) == 1
