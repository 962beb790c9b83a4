"""`envfarm learn` in miniature (a small suite on one env, a tiny model, one epoch, two GRPO steps):
the pipeline, the split and what each phase saw; and the packed SFT rows scoring each turn exactly
as its own sample. Learning itself is a benchmark (benchmarks/passes/2026-11-27-learning.md)."""

from __future__ import annotations

import json

import pytest
import torch

from cluster.compose import LocalFarm
from envfarm.farm import FarmConfig, PoolConfig
from trainer.grpo import Sample, completion_logprobs
from trainer.learn import LearnConfig, prepare, run
from trainer.packing import pack, packed_logprobs

ENV = "personal_banking_1"


def test_packed_rows_score_each_turn_as_its_own_sample(tiny_model) -> None:
    from trainer.hf import load_model

    model, tok = load_model(tiny_model)
    head = tok("system task list_tools listing").input_ids
    turns = [tok(f" call {k} ").input_ids for k in range(3)]
    results = [tok(f" result {k}").input_ids for k in range(3)]
    samples, seq = [], list(head)
    for turn, result in zip(turns, results, strict=True):
        samples.append(Sample(list(seq), turn, 1.0))
        seq += turn + result
    samples.append(Sample(head + turns[2] + results[2], turns[0], 1.0))  # a window dropped turns
    rows = pack(samples)
    assert len(rows) == 2 and rows[0].ids == head + turns[0] + results[0] + turns[1] + results[1] + turns[2]
    packed = packed_logprobs(model, rows, tok.pad_token_id).detach()
    alone = torch.cat([completion_logprobs(model, [s], tok.pad_token_id).detach() for s in samples])
    assert torch.allclose(packed, alone, atol=1e-5)


@pytest.mark.slow
def test_learn_pipeline_in_miniature(tmp_path) -> None:
    cfg = LearnConfig.model_validate({
        "out_dir": str(tmp_path / "learn"),
        "suite": {"envs": [ENV], "chains": 6, "draws": 2, "heldout_chains": 0.3, "heldout_values": 0.5,
                  "dir": str(tmp_path / "suite")},
        "model": {"dims": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16},
                  "vocab_size": 400},
        "episode": {"max_new_tokens": 12, "max_turns": 3},
        "warmup": {"steps": 30, "batch": 4, "length": 32, "span": [3, 6]},
        "sft": {"epochs": 2, "stop_at": 0.0, "probe_tasks": 2},
        "eval": {"every": 1, "train_tasks": 3},
        "grpo": {"steps": 2, "batch_size": 2, "group_size": 2, "micro_batch": 4}})
    suite = prepare(cfg, log=lambda line: None)
    with LocalFarm(FarmConfig(catalog=str(suite.catalog), envs=suite.envs, pool=PoolConfig(warm=2))) as farm:
        report = run(cfg, farm.url, suite, log=lambda line: None)
        # GRPO again from the saved SFT model: no warm-up or SFT, the same "sft" evaluation
        # (and each group's two members at their own temperatures)
        again = run(cfg.model_copy(update={"out_dir": str(tmp_path / "again"),
                                           "start_from": str(tmp_path / "learn" / "model_sft"),
                                           "grpo": {**cfg.grpo, "group_temperatures": [0.5, 1.0]}}),
                    farm.url, suite, log=lambda line: None)
        # --resume: one more GRPO step from the last checkpoint, earlier measurements kept
        built = [f.stat().st_mtime_ns for f in sorted((tmp_path / "learn" / "model_init").iterdir())]
        more = run(cfg.model_copy(update={"resume": True, "grpo": {**cfg.grpo, "steps": 3}}),
                   farm.url, suite, log=lambda line: None)
        with pytest.raises(ValueError, match="no finished learn run"):
            run(cfg.model_copy(update={"resume": True, "out_dir": str(tmp_path / "none")}),
                farm.url, suite, log=lambda line: None)
    assert [r["step"] for r in more["grpo_curve"]] == [0, 1, 2]
    assert [f.stat().st_mtime_ns for f in sorted((tmp_path / "learn" / "model_init").iterdir())] == built
    assert more["grpo_curve"][:2] == report["grpo_curve"]
    assert list(more["evals"]) == ["init", "sft", "grpo"] and more["evals"]["sft"] == report["evals"]["sft"]
    assert more["resumed"]["seconds"] == report["seconds"] and more["sft"] == report["sft"]
    steps = (tmp_path / "learn" / "grpo" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in steps] == [0, 1, 2]
    assert list(again["evals"]) == ["sft", "grpo"] and "warmup" not in again and "sft" not in again
    assert again["evals"]["sft"]["greedy"] == report["evals"]["sft"]["greedy"]
    assert [r["step"] for r in again["grpo_curve"]] == [0, 1]
    assert all(list(r["by_temperature"]) == ["T0.5", "T1"] for r in again["grpo_curve"])
    assert all(r["by_temperature"] == {} for r in report["grpo_curve"])  # one temperature
    assert list(report["evals"]) == ["init", "sft", "grpo"]
    assert list(report["evals"]["init"]) == ["greedy"] and list(report["evals"]["grpo"]) == ["greedy", "sampled"]
    held = len(suite.jobs("heldout"))
    for mode in report["evals"]["grpo"].values():
        assert mode["train"]["episodes"] == 3 and mode["all"]["episodes"] == 3 + held
    # the copy warm-up ran before SFT, on the tokens of the train texts (chance: ln of the pool)
    warm = report["warmup"]
    assert len(warm["loss_per_100"]) == 1 and warm["pool"] > 20 and warm["chance"] > 3
    assert report["cpu_seconds"]["warmup"] > 0
    # SFT saw train tasks only, and stopped after its first probe (stop_at 0)
    assert report["sft"]["tasks"] == len(suite.jobs("train")) and report["sft"]["epochs"] == 1
    assert len(report["sft"]["probe"]) == 1
    # GRPO was pure (the model's own rollouts), on train tasks, with held-out checks every step
    curve = report["grpo_curve"]
    assert [r["step"] for r in curve] == [0, 1] and all("heldout_greedy_success" in r for r in curve)
    grpo = [json.loads(line) for line in steps]
    assert all(r["guided_episodes"] == 0 and r["model_episodes"] == 4 for r in grpo)
    assert report["cpu_seconds"]["total"] > 0 and report["load"]["start"]
    machine = report["machine"]  # a timing names what it ran on
    assert machine["cores"] >= 1 and machine["torch_threads"] == cfg.threads and machine["cpu"]
    assert machine["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert (tmp_path / "learn" / "learn.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "learn" / "learn.json").read_text())
    assert saved["evals"] == report["evals"] and saved["writer"].startswith("template writer")
