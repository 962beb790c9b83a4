from __future__ import annotations

import pytest

from envfarm import EnvBundle, EnvRuntime
from envfarm.models import DBSchema, SampleData

from .toy_env import CODE, SAMPLE, SCHEMA


def toy_bundle(code: str = CODE) -> EnvBundle:
    return EnvBundle(name="toy", code=code, db_schema=DBSchema.model_validate(SCHEMA),
                     sample_data=SampleData.model_validate(SAMPLE), tasks=["noop"])


@pytest.fixture(scope="module")
def toy_runtime() -> EnvRuntime:
    return EnvRuntime(toy_bundle(), call_timeout_s=0.5)


@pytest.fixture(scope="session")
def content_platform(awm_catalog) -> EnvRuntime:
    return EnvRuntime(awm_catalog["content_platform_1"])
