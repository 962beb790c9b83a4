"""Hostile JSON on every route, HTTP and MCP: a typed 400 and the connection kept; and a
hypothesis fuzz over both surfaces that never gets a 5xx."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.compose import LocalFarm
from envfarm.farm import FarmConfig, PoolConfig
from envfarm.farm._json_guard import hostile
from tests.envfarm.farm.conftest import ENV

DEEP = b"[" * 3000 + b"]" * 3000  # 6 KB
HOSTILE = {
    "deep nesting": DEEP,
    "deep arguments": b'{"tool": "list_wishlists", "arguments": {"a": ' + b"[" * 100
                      + b"]" * 100 + b"}}",
    "huge integer": b'{"tool": "list_wishlists", "arguments": {"limit": 1' + b"0" * 40 + b"}}",
    "very long integer": b'{"tool": "list_wishlists", "arguments": {"limit": 1' + b"0" * 5000
                         + b"}}",
    "huge float": b'{"tool": "list_wishlists", "arguments": {"limit": 1e999}}',
    "NaN": b'{"tool": "list_wishlists", "arguments": {"limit": NaN}}',
    "Infinity": b'{"ttl_s": -Infinity}',
    "duplicate keys": b'{"tool": "list_wishlists", "tool": "create_wishlist"}',
    "invalid UTF-8": b'{"tool": "list_\xff\xfewishlists"}',
    "lone surrogate": b'{"tool": "list_wishlists", "arguments": {"name": "\\ud800"}}',
}
MCP = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def farm(bundled_catalog) -> Iterator[LocalFarm]:
    with LocalFarm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2))) as running:
        yield running


@pytest.fixture(scope="module")
def lease(farm) -> dict:
    conn = http.client.HTTPConnection(farm.host, farm.port)
    try:
        conn.request("POST", f"/envs/{ENV}/leases", body=b"{}",
                     headers={"Content-Type": "application/json"})
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def routes(info: dict) -> dict[str, tuple[str, dict[str, str]]]:
    base = f"/envs/{ENV}/leases/{info['lease_id']}"
    auth = {"Authorization": f"Bearer {info['token']}", "Content-Type": "application/json"}
    return {
        "create lease": (f"/envs/{ENV}/leases", {}),
        "create leases": (f"/envs/{ENV}/leases:batch", {}),
        "call": (base + "/call", auth),
        "verify": (base + "/verify", auth),
        "reset": (base + "/reset", auth),
        "mcp bearer": (base + "/mcp", {**auth, **MCP}),
        "mcp capability": (urlsplit(info["mcp_url"]).path, MCP),
        "batch": ("/batch/call", {}),
        "owner batch": (f"/envs/{ENV}/owners/{info['lease_id'].split('-')[0]}/batch", {}),
    }


def test_every_hostile_body_on_every_route_is_a_typed_400_on_one_connection(farm, lease):
    conn = http.client.HTTPConnection(farm.host, farm.port)
    conn.connect()
    sock = conn.sock
    try:
        one_connection(conn, lease)
    finally:
        conn.close()
    assert sock.fileno() == -1  # closed by us, not before


def one_connection(conn: http.client.HTTPConnection, lease: dict) -> None:
    sock = conn.sock
    for route, (path, headers) in routes(lease).items():
        for name, body in HOSTILE.items():
            conn.request("POST", path, body=body, headers=headers)
            r = conn.getresponse()
            answer = r.read()
            assert r.status == 400, (route, name, r.status, answer[:200])
            assert json.loads(answer)["error"]["type"] == "MalformedJSON", (route, name)
            assert not r.will_close, (route, name)
    assert conn.sock is sock  # one keep-alive connection all along
    conn.request("POST", f"/envs/{ENV}/leases/{lease['lease_id']}/call",
                 body=b'{"tool": "list_wishlists"}',
                 headers={"Authorization": f"Bearer {lease['token']}",
                          "Content-Type": "application/json"})
    assert json.loads(conn.getresponse().read())["ok"] is True  # and the lease still works


def test_ordinary_json_is_not_hostile():
    assert hostile(b'{"a": [1, 2.5, -3, "x\\u00e9\\ud83d\\ude00", null, true], "b": {}}') is None
    assert hostile(b"not json") is None  # the route answers that one in its own protocol
    assert hostile(b"[" * 64 + b"]" * 64) is None
    assert hostile(b"[" * 65 + b"]" * 65) is not None


# -- fuzz ----------------------------------------------------------------------------------------
_scalars = (st.none() | st.booleans() | st.integers() | st.floats()
            | st.text(max_size=20) | st.sampled_from(["\ud800", "\udfff\ud800", "\x00"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                       max_leaves=20)
_tools = st.sampled_from(["list_wishlists", "create_wishlist", "get_reservation", "search_hotels",
                          "no_such_tool", ""])


def _dumps(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()  # NaN and lone surrogates included


@st.composite
def bodies(draw) -> tuple[str, bytes]:
    surface = draw(st.sampled_from(["call", "mcp", "lease", "verify"]))
    shape = draw(st.sampled_from(["valid", "value", "raw", "deep"]))
    if shape == "raw":
        return surface, draw(st.binary(max_size=64))
    if shape == "deep":
        n = draw(st.integers(1, 4000))
        inner = b"[" * n + b"]" * n
        if surface == "mcp":
            return surface, (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": '
                             b'{"name": "list_wishlists", "arguments": {"a": ' + inner + b"}}}")
        return surface, b'{"tool": "list_wishlists", "arguments": {"a": ' + inner + b"}}"
    if shape == "value":
        return surface, _dumps(draw(_values))
    arguments = draw(st.dictionaries(st.text(max_size=12), _values, max_size=4))
    if surface == "mcp":
        return surface, _dumps({"jsonrpc": "2.0", "id": draw(st.integers() | st.text()),
                                "method": draw(st.sampled_from(["tools/call", "tools/list"])),
                                "params": {"name": draw(_tools), "arguments": arguments}})
    if surface == "lease":
        return surface, _dumps({"task_idx": draw(_scalars), "ttl_s": draw(_scalars)})
    return surface, _dumps({"tool": draw(_tools), "arguments": arguments})


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=bodies())
def test_fuzz_http_and_mcp_never_answer_5xx(farm, lease, case):
    surface, body = case
    base = f"/envs/{ENV}/leases/{lease['lease_id']}"
    path, headers = {
        "call": (base + "/call", {"Authorization": f"Bearer {lease['token']}"}),
        "verify": (base + "/verify", {"Authorization": f"Bearer {lease['token']}"}),
        "mcp": (urlsplit(lease["mcp_url"]).path, MCP),
        "lease": (f"/envs/{ENV}/leases", {}),
    }[surface]
    conn = http.client.HTTPConnection(farm.host, farm.port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                       **headers})
        r = conn.getresponse()
        answer = r.read()
    finally:
        conn.close()
    assert r.status < 500, (surface, body[:200], r.status, answer[:300])
    if r.status == 201:  # a lease made by the fuzz: give it back
        made = json.loads(answer)
        conn = http.client.HTTPConnection(farm.host, farm.port)
        conn.request("DELETE", f"/envs/{ENV}/leases/{made['lease_id']}",
                     headers={"Authorization": f"Bearer {made['token']}"})
        conn.getresponse().read()
        conn.close()
