"""Property-based fuzzing of the lease API's OpenAPI (bounded examples): no 5xx, no crash."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from cluster.compose import compose_core
from envfarm import EnvRuntime, load_catalog
from envfarm.farm import FarmConfig, PoolConfig, build_app

ENV = "hotel_booking_1"

# Built at collection: schemathesis parametrizes from the schema itself.
_catalog = load_catalog()
_core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1, max_instances=64)),
                 catalog=_catalog, runtimes={ENV: EnvRuntime(_catalog[ENV])})
schema = schemathesis.openapi.from_asgi("/openapi.json", build_app(_core))


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    case.call_and_validate(checks=[not_a_server_error])
