from __future__ import annotations

import pytest

from envfarm import EnvRuntime

from tests.fakes.toy_env import toy_bundle


@pytest.fixture(scope="module")
def toy_runtime() -> EnvRuntime:
    return EnvRuntime(toy_bundle(), call_timeout_s=0.5)


@pytest.fixture(scope="session")
def content_platform(awm_catalog) -> EnvRuntime:
    return EnvRuntime(awm_catalog["content_platform_1"])
