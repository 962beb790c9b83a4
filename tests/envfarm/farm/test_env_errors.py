"""An env error during an episode makes its verdict invalid (environment_error, reward null),
through every public path: HTTP verify, the SDK's lease.verify() and the demo's episode."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cluster.compose import compose_core
from envfarm import EnvRuntime
from envfarm.client import ASGITransport, Farm, reference_episode
from envfarm.farm import FarmConfig, FarmCore, PoolConfig, build_app
from envfarm.models import ToolCall
from tests.envfarm.farm.conftest import ENV, farm_client, lifespan_running, new_lease

# A tool whose handler crashes: the env's fault, never the agent's.
BOOM = '''

@app.post("/api/boom", operation_id="boom_now", summary="Fail", description="Always fails.")
async def boom_now():
    raise RuntimeError("the env's database is on fire")
'''


@pytest.fixture(scope="module")
def faulty(bundled_catalog) -> tuple[object, EnvRuntime]:
    bundle = bundled_catalog[ENV]
    bundle = bundle.model_copy(update={"code": bundle.code + BOOM})
    catalog = type(bundled_catalog)({**bundled_catalog.bundles, ENV: bundle},
                                    bundled_catalog.problems, bundled_catalog.root)
    return catalog, EnvRuntime(bundle)


@pytest.fixture
def core(faulty) -> FarmCore:
    catalog, runtime = faulty
    return compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1)), catalog=catalog,
                        runtimes={ENV: runtime})


async def _call(client, path, auth, tool, arguments=None) -> dict:
    r = await client.post(path + "/call", headers=auth,
                          json={"tool": tool, "arguments": arguments or {}})
    assert r.status_code == 200, r.text
    return r.json()


async def test_http_verify_of_an_episode_with_an_env_error_is_invalid(core, bundled_catalog):
    async with farm_client(core) as client:
        path, auth, _ = await new_lease(client, task_idx=0)
        for step in bundled_catalog[ENV].solutions[0]:
            assert (await _call(client, path, auth, step.tool, step.arguments))["ok"]
        failed = await _call(client, path, auth, "boom_now")
        assert failed["error"]["kind"] == "env_error"
        verdict = (await client.post(path + "/verify", headers=auth)).json()
    # The task's rows are all there, yet the episode is not scored: the env failed the agent.
    assert verdict["outcome"] == "environment_error"
    assert verdict["reward"] is None and verdict["valid"] is False
    assert verdict["error_kind"] == "env_error" and verdict["task_idx"] == 0
    assert "boom_now" in verdict["details"]["env_errors"][0]


async def test_a_reset_starts_a_clean_episode_and_agent_errors_do_not_count(core,
                                                                            bundled_catalog):
    async with farm_client(core) as client:
        path, auth, _ = await new_lease(client, task_idx=0)
        assert (await _call(client, path, auth, "boom_now"))["error"]["kind"] == "env_error"
        assert (await client.post(path + "/reset", headers=auth)).status_code == 200
        unknown = await _call(client, path, auth, "no_such_tool")
        assert unknown["error"]["kind"] == "agent_error"
        for step in bundled_catalog[ENV].solutions[0]:
            assert (await _call(client, path, auth, step.tool, step.arguments))["ok"]
        verdict = (await client.post(path + "/verify", headers=auth)).json()
    assert verdict["outcome"] == "completed" and verdict["reward"] == 1.0


@pytest.fixture
async def farm(core) -> AsyncIterator[Farm]:
    app = build_app(core)
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app)) as f:
        yield f


async def test_sdk_verify_and_the_demo_episode_say_environment_error(farm, bundled_catalog):
    async with farm.lease(ENV, task_idx=0) as lease:
        res = await lease.call_result("boom_now")
        assert not res.ok and res.error.kind == "env_error"
        verdict = await lease.verify()
    assert verdict.outcome.value == "environment_error"
    assert verdict.reward is None and not verdict.valid
    # The demo's episode (`envfarm demo` runs reference_episode) reports the same.
    solution = [*bundled_catalog[ENV].solutions[0], ToolCall(tool="boom_now")]
    report = await reference_episode(farm, ENV, 0, solution)
    assert not report.steps[-1].ok
    assert report.verdict.outcome.value == "environment_error"
    assert report.verdict.reward is None and not report.verdict.valid
