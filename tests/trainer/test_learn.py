"""`envfarm learn` in miniature: random init -> eval -> SFT on train tasks' reference episodes
-> eval -> pure GRPO -> eval, on train and held-out tasks. Asserts the pipeline, not learning
(the real run and its figures: benchmarks/RESULTS.md, "Learning on CPU")."""

from __future__ import annotations

import json

import pytest

from cluster.compose import LocalFarm
from envfarm.farm import FarmConfig, PoolConfig
from trainer.learn import LearnConfig, run

pytestmark = pytest.mark.slow
ENV = "personal_banking_1"


def test_learn_pipeline_in_miniature(tmp_path, tiny_model, monkeypatch, bundled_catalog):
    monkeypatch.setenv("ENVFARM_CACHE", str(tiny_model.parents[1]))
    cfg = LearnConfig(out_dir=str(tmp_path / "learn"), envs=[ENV], train_tasks=[0],
                      heldout_tasks=[7], sft={"epochs": 2, "lr": 3e-3, "batch": 4},
                      eval_max_new_tokens=16,
                      grpo={"steps": 1, "batch_size": 1, "group_size": 2, "mini_batches": 2,
                            "max_turns": 2, "max_tool_chars": 200, "tool_listing": "names",
                            "max_new_tokens": 16, "micro_batch": 1})
    with LocalFarm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2))) as farm:
        report = run(cfg, farm.url, log=lambda line: None)
    assert list(report["evals"]) == ["init", "sft", "grpo"]
    for stage in report["evals"].values():
        assert stage["train"]["episodes"] == 1 and stage["heldout"]["episodes"] == 1
    # SFT saw the train task's reference episode, one sample per turn, and never a held-out one
    assert report["sft_tasks"] == [[ENV, 0]]
    assert report["sft_samples"] == len(bundled_catalog[ENV].solutions[0]) + 2
    assert report["sft_loss"][1] < report["sft_loss"][0]
    # GRPO was pure: the model's own rollouts only, on the train task
    grpo = [json.loads(line) for line in
            (tmp_path / "learn" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert len(grpo) == 1 and grpo[0]["guided_episodes"] == 0 and grpo[0]["model_episodes"] == 2
    assert (tmp_path / "learn" / "learn.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "learn" / "learn.json").read_text())
    assert saved["evals"] == report["evals"]
