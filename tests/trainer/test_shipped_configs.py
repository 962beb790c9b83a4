"""The configs shipped in trainer/configs validate: a typo in one fails here, not an hour into a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import TrainConfig
from trainer.learn import LearnConfig

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


@pytest.mark.parametrize("name", ["learn_cpu.yaml", "learn_cpu_decay.yaml", "learn_cpu_mixed.yaml"])
def test_the_learn_configs_and_their_grpo_settings_validate(name):
    cfg = LearnConfig.from_yaml(CONFIGS / name)
    grpo = TrainConfig.model_validate({**cfg.grpo, "model": "unused", "batched": True})
    assert grpo.steps >= 1 and grpo.temperature == cfg.grpo["temperature"]
    assert grpo.lr_at(grpo.steps - 1) > 0


def test_the_decay_config_is_learn_cpu_with_a_decaying_tail_only():
    """learn_cpu_decay.yaml's results are compared with learn_cpu.yaml's: nothing else may differ."""
    base = LearnConfig.from_yaml(CONFIGS / "learn_cpu.yaml").model_dump()
    decay = LearnConfig.from_yaml(CONFIGS / "learn_cpu_decay.yaml").model_dump()
    for cfg in (base, decay):
        cfg.pop("out_dir")
    assert decay["grpo"].pop("steps") == 200 and decay["grpo"].pop("lr_decay_from") == 120
    base["grpo"].pop("steps")
    assert decay == base


def test_the_mixed_config_is_the_decay_config_with_mixed_group_temperatures_only():
    """learn_cpu_mixed.yaml's results are compared with learn_cpu_decay.yaml's, seed by seed."""
    decay = LearnConfig.from_yaml(CONFIGS / "learn_cpu_decay.yaml").model_dump()
    mixed = LearnConfig.from_yaml(CONFIGS / "learn_cpu_mixed.yaml").model_dump()
    for cfg in (decay, mixed):
        cfg.pop("out_dir")
    assert mixed["grpo"].pop("group_temperatures") == [0.7, 1.0]
    assert mixed == decay


def test_the_train_config_validates():
    assert TrainConfig.from_yaml(CONFIGS / "tiny_cpu.yaml").steps >= 1
