"""TRL 1.16's GRPOTrainer on its OpenEnv rollout path (``environment_factory``) against a running
farm's ``/ws``, with the tiny model on CPU, for two steps: every rollout's episode is a farm
session whose reward is the farm's verification."""

from __future__ import annotations

import pytest

pytest.importorskip("trl", reason="trl is not installed (pip install '.[openenv]')")
pytest.importorskip("openenv.core.mcp_client", reason="openenv-core is not installed")

from envfarm.compose import LocalFarm  # noqa: E402
from envfarm.farm import FarmConfig, PoolConfig  # noqa: E402

ENV = "hotel_booking_1"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning",
                            "ignore::DeprecationWarning")
def test_grpo_trainer_runs_two_steps_against_the_farm(tmp_path, bundled_catalog, runtimes,
                                                      monkeypatch):
    from trainer.trl_openenv import train

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    config = FarmConfig(envs=[ENV], pool=PoolConfig(warm=2))
    with LocalFarm(config, catalog=bundled_catalog, runtimes={ENV: runtimes[ENV]}) as farm:
        history = train(farm.url, ENV, steps=2, generations=2, completion_tokens=16,
                        out_dir=tmp_path, use_cpu=True)
        verified = farm.core.metrics.verifications.labels(ENV, "agent_error")._value.get()
        created = farm.core.tenants.usage["anonymous"].created
    steps = [row for row in history if "loss" in row]
    assert [row["step"] for row in steps] == [1, 2]
    # the reward column is the farm's verdict (the env class's get_reward), one per rollout
    assert all("rewards/FarmEnv/mean" in row for row in steps)
    assert all(row["rewards/FarmEnv/mean"] == 0.0 for row in steps)  # random weights: no task done
    assert verified >= 4 and created >= 2
