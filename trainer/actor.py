"""The trainer as a Ray actor: the only module of ``trainer/`` that imports Ray.

    actor = TrainerActor.remote(config.model_dump(), farm_url)
    while not ray.get(actor.done.remote()):
        record = ray.get(actor.train_step.remote())

The actor owns the policy model and the optimizer (``trainer.train.Trainer``); episodes run on
the actor's event loop, talking to the farm over HTTP.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from trainer.config import TrainConfig

#: Workers import ``trainer`` from the same tree as the driver (not whatever is installed).
SOURCE_ROOT = str(Path(__file__).resolve().parents[1])


@ray.remote
class TrainerActor:
    def __init__(self, config: dict[str, Any], farm_url: str) -> None:
        from trainer.train import Trainer

        self.trainer = Trainer(TrainConfig.model_validate(config), farm_url)

    def done(self) -> bool:
        return self.trainer.done

    def next_step(self) -> int:
        return self.trainer.step

    async def train_step(self) -> dict[str, Any]:
        return await self.trainer.train_step()


def start_actor(config: TrainConfig, farm_url: str, num_cpus: float = 1.0) -> Any:
    """A TrainerActor on the current Ray cluster, importing this source tree."""
    env_vars = {"PYTHONPATH": SOURCE_ROOT}
    if os.environ.get("ENVFARM_API_KEY"):  # the farm key of `envfarm train --farm-key`
        env_vars["ENVFARM_API_KEY"] = os.environ["ENVFARM_API_KEY"]
    return TrainerActor.options(  # type: ignore[attr-defined]
        num_cpus=num_cpus, runtime_env={"env_vars": env_vars},
    ).remote(config.model_dump(), farm_url)


def train_on_ray(config: TrainConfig, farm_url: str, log: Callable[[str], Any] = print) -> None:
    """Drive a TrainerActor until the run's steps are done (on a local Ray when none runs)."""
    from trainer.train import headline

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    try:
        actor = start_actor(config, farm_url)
        while not ray.get(actor.done.remote()):
            record = ray.get(actor.train_step.remote())
            log(json.dumps(headline(record)))
    finally:
        if started:
            ray.shutdown()
