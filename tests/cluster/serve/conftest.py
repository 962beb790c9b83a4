"""One Serve farm shared by every Ray test of this package (Ray starts once: ~20 s here)."""

from __future__ import annotations

import socket
import warnings
from collections.abc import Iterator

import pytest

# Ray Serve 2.60 trips pydantic's deprecation warnings at import time (its own models); the suite
# turns warnings into errors, so import it once here with them silenced.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import ray.serve  # noqa: F401

ENV = "hotel_booking_1"
REPLICAS = 3


def _only_loopback() -> bool:
    return {name for _, name in socket.if_nameindex()} <= {"lo"}


def _start(config, options):
    if not _only_loopback():
        pytest.skip("Ray tests run inside a private network namespace: "
                    "unshare --net sh -c 'ip link set lo up && exec pytest ...'")
    from cluster.serve import start_farm

    return start_farm(config, options)


def _running(envs: list[str] | None, warm: int, pack: int = 1, **deployment) -> Iterator[object]:
    """A farm on a fresh embedded Ray for one test module, shut down after it."""
    from cluster.serve import DeploymentOptions, ServeOptions
    from envfarm.farm import FarmConfig, PoolConfig, free_port

    config = FarmConfig(pool=PoolConfig(warm=warm), **({"envs": envs} if envs else {}))
    farm = _start(config, ServeOptions(port=free_port(), num_cpus=2, pack=pack,
                                       deployment=DeploymentOptions(**deployment)))
    try:
        yield farm
    finally:
        farm.shutdown()


@pytest.fixture(scope="module")
def serve_farm(bundled_catalog) -> Iterator[object]:
    """One env on REPLICAS owner-routed replicas, plus the front app."""
    yield from _running([ENV], warm=4, num_replicas=REPLICAS)


@pytest.fixture(scope="module")
def packed_farm(bundled_catalog) -> Iterator[object]:
    """Every bundled env packed into one deployment of 2 replicas, reached through the front."""
    yield from _running(None, warm=2, pack=3, num_replicas=2)


#: Scale fast so the test stays short: a 1 s upscale and 2 s downscale delay over 1 s of metrics.
AUTOSCALING = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2,
               "metrics_interval_s": 0.5, "look_back_period_s": 1.0,
               "upscale_delay_s": 1.0, "downscale_delay_s": 2.0}


@pytest.fixture(scope="module")
def autoscaled_farm(bundled_catalog) -> Iterator[object]:
    """One env on an autoscaled pool (1 to 2 replicas) behind the Door."""
    yield from _running([ENV], warm=4, autoscaling_config=AUTOSCALING)
