"""Tools listed to agents as AWM's own server (fastapi-mcp) lists them, side by side with a
fastapi-mcp server built on the same env code: on the bundled envs and the AWM-1K samples."""

from __future__ import annotations

import warnings
from typing import Any

from cluster.compose import compose_core
from envfarm import EnvRuntime
from envfarm.farm import FarmConfig, PoolConfig
from envfarm.farm._schemas import first_type
from tests.envfarm.farm.conftest import farm_client

MCP = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def fastapi_mcp_tools(runtime: EnvRuntime) -> dict[str, dict[str, Any]]:
    """What AWM's server (``FastApiMCP(app)``, no filters) lists for this env's app: its
    ``setup_server`` steps. The class itself does not construct against the ``mcp`` SDK
    installed here (its low-level ``Server`` changed), so its steps are taken one by one."""
    from fastapi.openapi.utils import get_openapi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from fastapi_mcp.openapi.convert import convert_openapi_to_mcp_tools

    app = runtime.app
    openapi = get_openapi(title=app.title, version=app.version,
                          openapi_version=app.openapi_version, description=app.description,
                          routes=app.routes)
    tools, _ = convert_openapi_to_mcp_tools(openapi, describe_all_responses=False,
                                            describe_full_response_schema=False)
    return {t.name: {"description": t.description, "inputSchema": t.input_schema}
            for t in tools}


async def served_tools(catalog, env: str) -> dict[str, dict[str, Any]]:
    """tools/list over a lease's MCP endpoint (what a stock MCP client sees)."""
    core = compose_core(FarmConfig(envs=[env], pool=PoolConfig(warm=1)), catalog=catalog)
    async with farm_client(core) as c:
        info = (await c.post(f"/envs/{env}/leases", json={})).json()
        r = await c.post(info["mcp_url"], headers=MCP, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
        http_tools = (await c.get(f"/envs/{env}/leases/{info['lease_id']}/tools", headers={
            "Authorization": f"Bearer {info['token']}"})).json()
    listed = {t["name"]: {"description": t["description"], "inputSchema": t["inputSchema"]}
              for t in r.json()["result"]["tools"]}
    runtime_tools = {t.name: t.input_schema for t in core.envs[env].tools}
    assert {t["name"]: t["input_schema"] for t in http_tools} == runtime_tools  # exact, on HTTP
    return listed


def expected(reference: dict[str, Any]) -> dict[str, Any]:
    """fastapi-mcp's listing, with the first non-null type of a several-type union (it picks
    one from a set, whose order varies between processes)."""
    schema = dict(reference["inputSchema"])
    schema["properties"] = {k: first_type(v) for k, v in schema.get("properties", {}).items()}
    return {"description": reference["description"], "inputSchema": schema}


def untyped(tools: dict[str, dict[str, Any]]) -> list[str]:
    return [f"{name}.{p}" for name, t in tools.items()
            for p, prop in t["inputSchema"].get("properties", {}).items() if "type" not in prop]


async def check_env(catalog, env: str) -> int:
    reference = fastapi_mcp_tools(EnvRuntime(catalog[env]))
    served = await served_tools(catalog, env)
    assert served.keys() == reference.keys(), env
    for name in served:
        assert served[name] == expected(reference[name]), (env, name)
    assert untyped(served) == [], env
    return sum(len(t["inputSchema"].get("properties", {})) for t in served.values())


async def test_bundled_envs_list_tools_as_fastapi_mcp_does(bundled_catalog):
    params = [await check_env(bundled_catalog, env) for env in bundled_catalog.servable]
    assert sum(params) > 100


async def test_awm_samples_list_tools_as_fastapi_mcp_does(awm_catalog):
    for env in awm_catalog.servable:
        await check_env(awm_catalog, env)


async def test_optional_parameters_get_their_type_and_the_plain_rendering_stays(
        bundled_catalog):
    env = "hotel_booking_1"
    served = await served_tools(bundled_catalog, env)
    query = served["search_hotels"]["inputSchema"]["properties"]["query"]
    assert query["type"] == "string" and {"type": "null"} in query["anyOf"]
    assert "### Responses:" in served["search_hotels"]["description"]
    core = compose_core(FarmConfig(envs=[env], tool_schemas="envfarm"), catalog=bundled_catalog)
    plain = {t.name: t for t in core.tool_specs[env]}["search_hotels"]
    assert "type" not in plain.input_schema["properties"]["query"]


def test_first_type_takes_the_first_non_null_member():
    prop = {"anyOf": [{"type": "null"}, {"type": "integer"}, {"type": "string"}],
            "type": "string"}
    assert first_type(prop)["type"] == "integer"
    assert first_type({"type": "string"}) == {"type": "string"}
    assert first_type({"anyOf": [{"type": "null"}]}) == {"anyOf": [{"type": "null"}]}
