"""The configs shipped in trainer/configs validate: a typo in one fails here, not an hour into a run."""

from __future__ import annotations

from pathlib import Path

from trainer.config import TrainConfig
from trainer.learn import LearnConfig

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


def test_the_learn_config_and_its_grpo_settings_validate():
    cfg = LearnConfig.from_yaml(CONFIGS / "learn_cpu.yaml")
    grpo = TrainConfig.model_validate({**cfg.grpo, "model": "unused"})
    assert grpo.steps >= 1 and grpo.temperature == cfg.grpo["temperature"]
    assert grpo.lr_at(grpo.steps - 1) > 0


def test_the_train_config_validates():
    assert TrainConfig.from_yaml(CONFIGS / "tiny_cpu.yaml").steps >= 1
