"""Capability MCP URLs: a lease's absolute ``mcp_url`` is all an MCP client needs.

Driven the way AWM's own agent client (``awm agent --mcp_url URL``, mcp-agent 0.2.6) behaves:
no headers at all, and a fresh stateless MCP session for every operation (initialize, then one
of tools/list, prompts/list, resources/list, tools/call), here with the official ``mcp`` SDK.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.compose import LocalFarm
from envfarm.farm import (
    FarmConfig,
    PoolConfig,
    RedactCredentials,
    mcp_credential,
    redact_path,
)
from tests.envfarm.farm.conftest import ENV

MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def farm(bundled_catalog) -> Iterator[LocalFarm]:
    with LocalFarm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2))) as running:
        yield running


def new_lease(farm: LocalFarm, **body: Any) -> dict:
    r = httpx.post(f"{farm.url}/envs/{ENV}/leases", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def auth(info: dict) -> dict[str, str]:
    return {"Authorization": f"Bearer {info['token']}"}


def lease_path(farm: LocalFarm, info: dict) -> str:
    return f"{farm.url}/envs/{ENV}/leases/{info['lease_id']}"


async def post(url: str, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient() as c:
        return await c.post(url, **kw)


async def one_operation(url: str, op: str, *args: Any) -> Any:
    """A fresh MCP session for one operation, with no headers (AWM's client)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client()
    async with http, streamable_http_client(url, http_client=http) as streams, ClientSession(
            streams[0], streams[1]) as session:
        await session.initialize()
        return await getattr(session, op)(*args)


async def test_an_episode_from_the_url_alone_verifies_completed(farm, bundled_catalog):
    info = new_lease(farm, task_idx=0)
    url = info["mcp_url"]
    assert url.startswith(f"{farm.url}/envs/{ENV}/leases/{info['lease_id']}/mcp/")
    assert info["token"] not in url  # the credential is not the token
    tools = await one_operation(url, "list_tools")
    assert "create_reservation" in {t.name for t in tools.tools}
    assert (await one_operation(url, "list_prompts")).prompts == []
    assert (await one_operation(url, "list_resources")).resources == []
    for step in bundled_catalog[ENV].solutions[0]:
        res = await one_operation(url, "call_tool", step.tool, step.arguments)
        assert not res.is_error, res.content
    verdict = (await post(lease_path(farm, info) + "/verify", headers=auth(info))).json()
    assert (verdict["outcome"], verdict["reward"], verdict["valid"]) == ("completed", 1.0, True)


def test_the_bearer_header_still_works_and_credentials_do_not_travel(farm):
    a, b = new_lease(farm), new_lease(farm)
    msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    bearer_url = lease_path(farm, a) + "/mcp"
    assert httpx.post(bearer_url, json=msg, headers={**MCP_HEADERS, **auth(a)}).status_code == 200
    cred_a, cred_b = (x["mcp_url"].rsplit("/", 1)[1] for x in (a, b))
    # a's credential on b's path, b's on a's, a made-up one: refused, nothing else said
    for lease, cred in ((b, cred_a), (a, cred_b), (a, "x" * 43)):
        r = httpx.post(f"{lease_path(farm, lease)}/mcp/{cred}", json=msg, headers=MCP_HEADERS)
        assert r.status_code == 403, r.text
        assert cred not in r.text and lease["token"] not in r.text
    # the credential opens MCP only: not the lease API
    r = httpx.post(lease_path(farm, a) + "/verify", headers={"Authorization": f"Bearer {cred_a}"})
    assert r.status_code == 403
    httpx.delete(lease_path(farm, a), headers=auth(a))
    r = httpx.post(a["mcp_url"], json=msg, headers=MCP_HEADERS)
    assert r.status_code == 410


def test_the_credential_is_never_in_metrics_status_or_logs(farm, caplog):
    info = new_lease(farm)
    cred = info["mcp_url"].rsplit("/", 1)[1]
    assert cred == mcp_credential(info["token"])
    msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
           "params": {"name": "list_wishlists", "arguments": {}}}
    with caplog.at_level(logging.DEBUG):
        assert httpx.post(info["mcp_url"], json=msg, headers=MCP_HEADERS).status_code == 200
        httpx.post(info["mcp_url"] + "x", json=msg, headers=MCP_HEADERS)  # a wrong one
        texts = [httpx.get(farm.url + p).text for p in ("/metrics", "/status.json", "/healthz")]
    # the server's records (uvicorn, FastMCP, the farm), not this test's own HTTP client's
    server_logs = [r.getMessage() for r in caplog.records
                   if not r.name.startswith(("httpx", "httpcore"))]
    assert any("/mcp/" in r.getMessage() for r in caplog.records)  # the capture works
    for text in [*texts, *server_logs]:
        assert cred not in text and info["token"] not in text


def test_access_log_lines_are_redacted():
    record = logging.LogRecord("ray.serve", logging.INFO, __file__, 1, "%s %s", (
        "POST", "/envs/e/leases/o-1/mcp/SECRETcred_-x"), None)
    record.route = "/envs/e/leases/o-1/mcp/SECRETcred_-x"
    assert RedactCredentials().filter(record)
    assert "SECRET" not in record.getMessage() and "SECRET" not in record.route
    assert redact_path("/envs/e/leases/o-1/mcp") == "/envs/e/leases/o-1/mcp"


async def test_a_lease_whose_only_traffic_was_refused_verifies_invalid(farm):
    info = new_lease(farm, task_idx=0)
    msg = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    base = lease_path(farm, info)
    # a client that cannot send the header (and hides the 401), or got a wrong credential
    assert (await post(base + "/mcp", json=msg, headers=MCP_HEADERS)).status_code == 401
    assert (await post(base + "/mcp/wrong", json=msg, headers=MCP_HEADERS)).status_code == 403
    verdict = (await post(base + "/verify", headers=auth(info))).json()
    assert verdict["valid"] is False and verdict["reward"] is None
    assert verdict["outcome"] == "invalid" and "never connected" in verdict["reason"]
    assert verdict["details"]["refused_requests"] == 2
    # once its agent gets through, the episode is judged as usual (here: nothing done, 0.0)
    await one_operation(info["mcp_url"], "list_tools")
    verdict = (await post(base + "/verify", headers=auth(info))).json()
    assert (verdict["valid"], verdict["reward"]) == (True, 0.0)


def test_a_lease_with_no_traffic_at_all_is_judged_as_usual(farm):
    info = new_lease(farm, task_idx=0)
    verdict = httpx.post(lease_path(farm, info) + "/verify", headers=auth(info)).json()
    assert (verdict["valid"], verdict["reward"]) == (True, 0.0)


def test_public_url_sets_the_prefix(bundled_catalog):
    config = FarmConfig(envs=[ENV], pool=PoolConfig(warm=1), public_url="https://farm.example/")
    with LocalFarm(config) as running:
        info = new_lease(running)
    assert info["mcp_url"].startswith(f"https://farm.example/envs/{ENV}/leases/")


MCP_AGENT_PYTHON = os.environ.get("ENVFARM_MCP_AGENT_PYTHON")


@pytest.mark.skipif(not MCP_AGENT_PYTHON, reason=(
    "mcp-agent 0.2.6 (AWM's client) needs mcp<2, which this venv cannot hold: set "
    "ENVFARM_MCP_AGENT_PYTHON to the python of a venv with mcp-agent==0.2.6 'mcp<2' "
    "(see tests/envfarm/farm/awm_client.py)"))
def test_awm_client_mcp_agent_runs_an_episode_from_the_url(farm, bundled_catalog):
    info = new_lease(farm, task_idx=0)
    steps = [{"tool": s.tool, "arguments": s.arguments} for s in bundled_catalog[ENV].solutions[0]]
    proc = subprocess.Popen([MCP_AGENT_PYTHON, str(Path(__file__).with_name("awm_client.py")),
                             info["mcp_url"], json.dumps(steps)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:  # mcp-agent 0.2.6 may linger after its app exits: read up to "done", then end it
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == "done":
                break
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert lines[-1] == "done", lines
    assert any(line.startswith("tools ") and int(line.split()[1]) > 0 for line in lines)
    assert [line for line in lines if line.startswith("call")] == [
        f"call {s['tool']} ok" for s in steps]
    verdict = httpx.post(lease_path(farm, info) + "/verify", headers=auth(info)).json()
    assert (verdict["outcome"], verdict["reward"], verdict["valid"]) == ("completed", 1.0, True)
