"""The one-call fast paths answer what FastAPI / FastMCP answer, and leave the rest to them.

Each case runs against two in-process farms side by side: one with the fast paths, one with
``fast_paths=False`` (every request through the frameworks). The answers must match, and the
fast farm's counter says which path answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import httpx
import pytest

from tests.envfarm.farm.conftest import ENV, farm_client, new_lease

MCP_HEADERS = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}


@pytest.fixture
async def pair(make_core) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, object]]:
    """(fast client, framework-only client, the fast farm's LeaseMCP)."""
    fast_core, slow_core = make_core(), make_core(fast_paths=False)
    async with AsyncExitStack() as stack:
        fast = await stack.enter_async_context(farm_client(fast_core))
        slow = await stack.enter_async_context(farm_client(slow_core))
        yield fast, slow, fast._transport.app.state.mcp  # type: ignore[attr-defined]


def tools_call(name: str, arguments: object = None, rid: object = 1, **params) -> dict:
    body = {"name": name, **params}
    if arguments is not None:
        body["arguments"] = arguments
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": body}


async def both(pair, method: str, body: object, *, mcp: bool, headers: dict | None = None,
               path_tail: str | None = None) -> tuple[httpx.Response, httpx.Response]:
    """The same request on a fresh lease of each farm."""
    out = []
    for client in pair[:2]:
        path, auth, info = await new_lease(client)
        url = info["mcp_url"] if mcp else path + (path_tail or "/call")
        base = MCP_HEADERS if mcp else {}
        out.append(await client.request(method, url, json=body,
                                        headers={**base, **auth, **(headers or {})}))
    return out[0], out[1]


@pytest.mark.parametrize("body", [
    tools_call("get_my_profile", {}),
    tools_call("get_my_profile", rid="req-7"),  # no arguments, a string id
    tools_call("list_wishlists", {}, _meta={"progressToken": 3}),
    tools_call("get_reservation", {"reservation_id": 99999}),  # the env's 404: agent_error
    tools_call("get_reservation", {"reservation_id": "x"}),  # the env rejects the argument
    tools_call("get_reservation", {}),  # a required argument missing
])
async def test_mcp_tools_call_matches_fastmcp(pair, body):
    before = pair[2].fast_calls
    fast, slow = await both(pair, "POST", body, mcp=True)
    assert fast.status_code == slow.status_code == 200
    assert fast.headers["content-type"] == slow.headers["content-type"] == "application/json"
    assert fast.json() == slow.json()
    assert pair[2].fast_calls == before + 1


@pytest.mark.parametrize("body", [
    tools_call("no_such_tool", {}),  # FastMCP's own "Unknown tool" answer
    tools_call(["get_my_profile"], {}),  # a name that is not a string
    tools_call("get_my_profile", [1, 2]),  # arguments not an object: FastMCP's error
    tools_call("get_my_profile", {}, rid=None),  # a notification-like id
    tools_call("get_my_profile", {}, _meta={"io.modelcontextprotocol/protocolVersion": "x"}),
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
    [tools_call("get_my_profile", {})],  # a batch
])
async def test_other_mcp_messages_go_to_fastmcp(pair, body):
    before = pair[2].fast_calls
    fast, slow = await both(pair, "POST", body, mcp=True)
    assert (fast.status_code, fast.text) == (slow.status_code, slow.text)
    assert pair[2].fast_calls == before


@pytest.mark.parametrize("headers", [
    {"Accept": "text/event-stream"},  # must accept JSON: 406
    {"Content-Type": "text/plain"},  # 400
    {"mcp-protocol-version": "1999-01-01"},  # not a version the transport takes as is
])
async def test_mcp_headers_fastmcp_rejects_are_left_to_it(pair, headers):
    before = pair[2].fast_calls
    fast, slow = await both(pair, "POST", tools_call("get_my_profile", {}), mcp=True,
                            headers=headers)
    assert fast.status_code == slow.status_code != 200
    assert fast.text == slow.text
    assert pair[2].fast_calls == before


async def test_mcp_fast_path_checks_the_lease_and_token(pair):
    fast = pair[0]
    _, auth, info = await new_lease(fast)
    body = tools_call("get_my_profile", {})
    url = info["mcp_url"].rsplit("/", 1)[0]  # the bearer endpoint (no credential in the path)
    assert (await fast.post(url, json=body, headers=MCP_HEADERS)).status_code == 401
    wrong = {**MCP_HEADERS, "Authorization": "Bearer wrong"}
    r = await fast.post(url, json=body, headers=wrong)
    assert r.status_code == 403 and r.json()["error"]["kind"] == "forbidden"
    await fast.delete(url.removesuffix("/mcp"), headers=auth)
    r = await fast.post(url, json=body, headers={**MCP_HEADERS, **auth})
    assert r.status_code == 410 and r.json()["error"]["kind"] == "gone"


async def test_mcp_calls_change_the_lease_state_seen_over_http(pair):
    fast = pair[0]
    path, auth, info = await new_lease(fast)
    r = await fast.post(info["mcp_url"], headers={**MCP_HEADERS, **auth},
                        json=tools_call("create_wishlist", {"name": "fast-path"}))
    assert r.json()["result"]["structuredContent"]["name"] == "fast-path"
    listed = await fast.post(path + "/call", headers=auth, json={"tool": "list_wishlists"})
    assert "fast-path" in {w["name"] for w in listed.json()["result"]["wishlists"]}


@pytest.mark.parametrize("body", [
    {"tool": "get_my_profile", "arguments": {}},
    {"tool": "get_my_profile"},
    {"tool": "get_reservation", "arguments": {"reservation_id": 99999}},
    {"tool": "no_such_tool"},
    {"tool": ""},  # FastAPI's 422 from here on
    {"tool": "get_my_profile", "arguments": [1]},
    {"tool": "get_my_profile", "extra": 1},
    ["get_my_profile"],
])
async def test_http_call_matches_fastapi(pair, body):
    fast, slow = await both(pair, "POST", body, mcp=False)
    assert fast.status_code == slow.status_code
    a, b = fast.json(), slow.json()
    if "elapsed_ms" in a:
        a.pop("elapsed_ms"), b.pop("elapsed_ms")
    assert a == b


async def test_http_fast_path_lease_errors_are_typed(pair):
    fast = pair[0]
    path, auth, _ = await new_lease(fast)
    body = {"tool": "get_my_profile"}
    r = await fast.post(path + "/call", json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = await fast.post(path + "/call", json=body, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 403
    r = await fast.post(f"/envs/{ENV}/leases/zz-abc123/call", json=body, headers=auth)
    assert r.status_code == 410 and r.json()["error"]["kind"] == "gone"
    await fast.delete(path, headers=auth)
    r = await fast.post(path + "/call", json=body, headers=auth)
    assert r.status_code == 410
    big = {"tool": "get_my_profile", "arguments": {"pad": "x" * (2 << 20)}}
    r = await fast.post(path + "/call", json=big, headers=auth)
    assert r.status_code == 413


MODERN = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call"}
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.mark.parametrize(("name", "arguments", "headers", "fast_path"), [
    ("get_my_profile", {}, {"mcp-name": "get_my_profile"}, True),
    ("get_reservation", {"reservation_id": 99999}, {"mcp-name": "get_reservation"}, True),
    ("get_my_profile", {}, {"mcp-name": "list_wishlists"}, False),  # header/body mismatch
    ("get_my_profile", {}, {}, False),  # no Mcp-Name header
    ("get_my_profile", {}, {"mcp-name": "get_my_profile", "mcp-method": "tools/list"}, False),
])
async def test_modern_era_tools_call_matches_fastmcp(pair, name, arguments, headers, fast_path):
    """The 2026-07-28 single-exchange era (what fastmcp.Client speaks): same answers, and the
    SDK's own validation ladder decides what the fast path may take."""
    before = pair[2].fast_calls
    body = tools_call(name, arguments, _meta=ENVELOPE)
    fast, slow = await both(pair, "POST", body, mcp=True, headers={**MODERN, **headers})
    assert fast.status_code == slow.status_code
    assert fast.json() == slow.json()
    assert pair[2].fast_calls == before + fast_path


async def test_modern_era_without_the_envelope_is_fastmcps_400(pair):
    before = pair[2].fast_calls
    fast, slow = await both(pair, "POST", tools_call("get_my_profile", {}), mcp=True,
                            headers={**MODERN, "mcp-name": "get_my_profile"})
    assert fast.status_code == slow.status_code == 400
    assert fast.json() == slow.json()
    assert pair[2].fast_calls == before
