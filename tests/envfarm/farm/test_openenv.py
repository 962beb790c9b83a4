"""The OpenEnv endpoint (``/ws``) driven by openenv-core's own client against a running farm.

``MCPToolClient`` is used unchanged where it reads what an AWM server sends (rewards, tool
listings, ``metadata``); ``AWMShaped`` (openenv_client.py) reads the AWM fields besides. With ``ENVFARM_AWM_ENV_PATH`` set to the ``envs``
folder of a checkout of meta-pytorch/OpenEnv, the real ``AWMEnv`` runs an episode too.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import pytest

openenv = pytest.importorskip("openenv.core.mcp_client",
                              reason="openenv-core is not installed (pip install '.[openenv]')")

from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction  # noqa: E402

from envfarm.client import openenv_base_url  # noqa: E402
from envfarm.compose import LocalFarm  # noqa: E402
from envfarm.farm import FarmConfig, PoolConfig, Quota, Tenant, TenantsConfig, hash_key  # noqa: E402
from tests.envfarm.farm.conftest import ENV  # noqa: E402
from tests.envfarm.farm.openenv_client import AWMShaped  # noqa: E402

MCPToolClient = openenv.MCPToolClient
TASK = 4  # search, create_wishlist, add_hotel_to_wishlist x2 (the reference solution)
KEY, OTHER_KEY = "efk_openenv_test_key", "efk_openenv_other_key"


@pytest.fixture(scope="module")
def farm(bundled_catalog, hotel_runtime):
    tenants = TenantsConfig(require_key=True, tenants=[
        Tenant(name="acme", key_sha256=hash_key(KEY)),
        Tenant(name="small", key_sha256=hash_key(OTHER_KEY), max_leases=1)])
    config = FarmConfig(envs=[ENV], pool=PoolConfig(warm=8, max_instances=600), tenants=tenants)
    with LocalFarm(config, catalog=bundled_catalog, runtimes={ENV: hotel_runtime}) as local:
        yield local


@pytest.fixture
def url(farm) -> str:
    return openenv_base_url(farm.url, KEY)


async def leases_drop_to(farm, count: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(farm.core.leases) > count:
        assert time.monotonic() < deadline, f"{len(farm.core.leases)} leases still open"
        await asyncio.sleep(0.02)


async def test_reference_episode_verifies_and_a_noop_does_not(farm, url, bundled_catalog):
    async with MCPToolClient(base_url=url) as env:
        await env.reset(scenario=ENV, task_idx=TASK)
        tools = await env.list_tools()
        assert len(tools) > 10 and all(t.input_schema for t in tools)
        assert not {"verify", "done", "__list_scenarios__", "fork"} & {t.name for t in tools}
        for step in bundled_catalog[ENV].solutions[TASK]:
            await env.step(CallToolAction(tool_name=step.tool, arguments=step.arguments))
        result = await env.step(CallToolAction(tool_name="verify",
                                               arguments={"verifier_mode": "code"}))
        assert result.reward == 1.0 and not result.done
    async with MCPToolClient(base_url=url) as env:
        await env.reset(scenario=ENV, task_idx=TASK)
        result = await env.step(CallToolAction(tool_name="verify", arguments={}))
        assert result.reward is not None and result.reward < 1.0
    await leases_drop_to(farm, 0)


async def test_observations_are_awm_shaped(url, bundled_catalog):
    async with AWMShaped(base_url=url) as env:
        obs = (await env.reset(scenario=ENV, task_idx=TASK)).observation
        assert obs.reward_type == "reset_ok" and obs.scenario == ENV and obs.task_idx == TASK
        assert obs.task == bundled_catalog[ENV].tasks[TASK]
        assert obs.has_verifier == {"sql": True, "code": True} and obs.num_tools > 10
        listed = (await env.step(ListToolsAction())).observation
        assert len(listed.tools) == obs.num_tools and listed.tools[0].input_schema
        assert listed.error is None
        step = bundled_catalog[ENV].solutions[TASK][0]
        res = await env.step(CallToolAction(tool_name=step.tool, arguments=step.arguments))
        assert res.observation.reward_type == "tool_call_ok" and res.reward == 0.0
        assert isinstance(json.loads(res.observation.tool_result), (dict, list))
        res = await env.step(CallToolAction(tool_name="verify", arguments={"verifier_mode": "sql"}))
        assert res.observation.reward_type in ("others", "incomplete", "agent_error")
        assert res.observation.verify_result["outcome"] and res.observation.steps_taken == 3
        scen = (await env.step(CallToolAction(tool_name="__list_scenarios__"))).observation
        assert scen.total == 1 and scen.scenarios[0]["name"] == ENV
        assert scen.scenarios[0]["num_tasks"] == len(bundled_catalog[ENV].tasks)
        state = await env.state()
        assert state.step_count == 4 and state.episode_id
        done = await env.step(CallToolAction(tool_name="done"))
        assert done.done and done.observation.reward_type == "episode_done"
        again = await env.step(ListToolsAction())
        assert again.observation.reward_type == "episode_already_done"


async def test_typed_errors_for_unknown_scenario_task_and_tool(url):
    async with MCPToolClient(base_url=url) as env:  # read through metadata, unchanged client
        obs = (await env.reset(scenario="no_such_env")).observation
        assert obs.metadata == {"error_kind": "not_found", "error_type": "EnvNotFound"}
        obs = (await env.reset(scenario=ENV, task_idx=99)).observation
        assert obs.metadata["error_type"] == "TaskNotFound"
    async with AWMShaped(base_url=url) as env:
        obs = (await env.reset(scenario="no_such_env")).observation
        assert obs.reward_type == "reset_error" and "no_such_env" in obs.error
        await env.reset(scenario=ENV, task_idx=0)
        res = await env.step(CallToolAction(tool_name="no_such_tool"))
        assert res.observation.reward_type == "tool_not_found" and res.reward == -1.0
        assert res.observation.metadata["error_type"] == "AgentError"
        res = await env.step(CallToolAction(tool_name="get_reservation",
                                            arguments={"reservation_id": "not a number"}))
        assert res.observation.reward_type == "invalid_args"
        res = await env.step(CallToolAction(tool_name="verify",
                                            arguments={"verifier_mode": "magic"}))
        assert res.observation.reward_type == "invalid_args"
    with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
        async with MCPToolClient(base_url=url) as env:
            await env.step({"type": "call_tool"})  # no tool_name


async def test_256_concurrent_sessions(farm, url):
    """256 sockets each hold a lease at the same moment, each makes a call, all give back."""
    count, all_open = 0, asyncio.Event()

    async def one(i: int) -> str:
        nonlocal count
        async with MCPToolClient(base_url=url, message_timeout_s=60) as env:
            await env.reset(scenario=ENV, task_idx=i % 10)
            count += 1
            if count == 256:
                assert len(farm.core.leases) == 256  # every session holds its lease now
                all_open.set()
            await all_open.wait()
            res = await env.step(CallToolAction(tool_name="list_wishlists", arguments={}))
            return res.observation.tool_name

    started = time.perf_counter()
    held = asyncio.ensure_future(all_open.wait())
    names = await asyncio.gather(*(one(i) for i in range(256)))
    assert held.done() and names == ["list_wishlists"] * 256
    await leases_drop_to(farm, 0)
    print(f"256 sessions in {time.perf_counter() - started:.2f} s", file=sys.stderr)
    peak = farm.core.tenants.usage["acme"]
    assert peak.created >= 256 and peak.leases == 0


async def test_a_dropped_socket_frees_its_lease(farm, url):
    env = MCPToolClient(base_url=url)
    await env.connect()
    await env.reset(scenario=ENV, task_idx=0)
    assert len(farm.core.leases) == 1
    env._ws.transport.abort()  # the TCP connection dies: no close frame, no goodbye
    await leases_drop_to(farm, 0)


async def test_wrong_or_missing_key_is_refused_and_quotas_apply(farm):
    for base, code in ((openenv_base_url(farm.url, "efk_wrong"), "FORBIDDEN"),
                       (farm.url, "UNAUTHORIZED")):
        with pytest.raises(RuntimeError, match=code):
            async with MCPToolClient(base_url=base) as env:
                await env.reset(scenario=ENV)
    assert not farm.core.leases
    small = openenv_base_url(farm.url, OTHER_KEY)
    async with MCPToolClient(base_url=small) as first, MCPToolClient(base_url=small) as second:
        await first.reset(scenario=ENV, task_idx=0)
        assert {lease.tenant for lease in farm.core.leases.values()} == {"small"}
        obs = (await second.reset(scenario=ENV, task_idx=0)).observation
        assert obs.metadata["error_type"] == "QuotaExceeded"
    await leases_drop_to(farm, 0)


async def test_fork_through_the_hidden_tool(farm, url, bundled_catalog):
    steps = bundled_catalog[ENV].solutions[TASK]
    async with AWMShaped(base_url=url) as parent, AWMShaped(base_url=url) as branch:
        await parent.reset(scenario=ENV, task_idx=TASK)
        for step in steps[:2]:
            await parent.step(CallToolAction(tool_name=step.tool, arguments=step.arguments))
        forked = (await parent.step(CallToolAction(tool_name="fork"))).observation.tool_result
        assert forked["task_idx"] == TASK and forked["forked_from"]
        obs = (await branch.reset(scenario=ENV, task_idx=TASK, lease_id=forked["lease_id"],
                                  lease_token=forked["token"])).observation
        assert obs.reward_type == "reset_ok"
        for step in steps[2:]:
            await branch.step(CallToolAction(tool_name=step.tool, arguments=step.arguments))
        assert (await branch.step(CallToolAction(tool_name="verify"))).reward == 1.0
        assert (await parent.step(CallToolAction(tool_name="verify"))).reward < 1.0
        assert farm.core.leases[forked["lease_id"]].forked_from == forked["forked_from"]
        bad = (await branch.reset(scenario=ENV, lease_id=forked["lease_id"],
                                  lease_token="wrong")).observation
        assert bad.metadata["error_type"] == "LeaseForbidden"
    await leases_drop_to(farm, 0)


async def test_the_real_awm_client(url, bundled_catalog):
    """OpenEnv's own ``AWMEnv`` (from a checkout of meta-pytorch/OpenEnv), unchanged."""
    path = os.environ.get("ENVFARM_AWM_ENV_PATH")
    if not path:
        pytest.skip("set ENVFARM_AWM_ENV_PATH to the envs/ folder of a meta-pytorch/OpenEnv "
                    "checkout to run OpenEnv's own AWMEnv client")
    sys.path.insert(0, path)
    try:
        from agent_world_model_env.client import AWMEnv
    finally:
        sys.path.remove(path)
    async with AWMEnv(base_url=url) as env:
        obs = (await env.reset(scenario=ENV, task_idx=TASK)).observation
        assert obs.reward_type == "reset_ok" and obs.num_tools > 10
        for step in bundled_catalog[ENV].solutions[TASK]:
            res = await env.step(CallToolAction(tool_name=step.tool, arguments=step.arguments))
            assert res.observation.reward_type == "tool_call_ok", res.observation.error
        res = await env.step(CallToolAction(tool_name="verify",
                                            arguments={"verifier_mode": "code"}))
        assert res.reward == 1.0 and res.observation.reward_type == "complete"
        done = await env.step(CallToolAction(tool_name="done"))
        assert done.done
