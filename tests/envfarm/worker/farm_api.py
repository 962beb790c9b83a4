"""An async client of the farm's lease API for the tenancy tests (issue 34)."""

from __future__ import annotations

from typing import Any

import httpx

from envfarm.farm import Tenant, TenantsConfig, hash_key

#: Two tenants' farm API keys; keyless requests are a third tenant (``anonymous``).
KEYS = {"alpha": "efk_alpha-0123456789abcdef", "beta": "efk_beta-0123456789abcdef"}
MCP_HEADERS = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}


class Lease:
    """One lease as its holder sees it: its path, credentials, and the calls it makes."""

    def __init__(self, http: httpx.AsyncClient, info: dict[str, Any]) -> None:
        self.http = http
        self.info = info
        self.id = info["lease_id"]
        self.path = f"/envs/{info['env']}/leases/{self.id}"
        self.auth = {"Authorization": f"Bearer {info['token']}"}

    async def call(self, tool: str, /, **arguments: Any) -> httpx.Response:
        return await self.http.post(self.path + "/call", headers=self.auth,
                                    json={"tool": tool, "arguments": arguments})

    def item(self, tool: str, /, **arguments: Any) -> dict[str, Any]:
        """This lease's call as an item of ``POST /batch/call``."""
        return {"env": self.info["env"], "lease_id": self.id, "token": self.info["token"],
                "tool": tool, "arguments": arguments}

    async def mcp_call(self, tool: str, /, **arguments: Any) -> httpx.Response:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments}}
        return await self.http.post(self.path + "/mcp", headers={**self.auth, **MCP_HEADERS},
                                    json=body)

    async def titles(self) -> list[str]:
        r = await self.call("list_notes")
        assert r.status_code == 200 and r.json()["ok"], r.text
        return [n["title"] for n in r.json()["result"]]

    async def pid(self) -> int:
        r = await self.call("whoami")
        assert r.status_code == 200 and r.json()["ok"], r.text
        return r.json()["result"]["pid"]

    async def fork(self) -> Lease:
        r = await self.http.post(self.path + "/fork", headers=self.auth, json={})
        assert r.status_code == 201, r.text
        return Lease(self.http, r.json())

    async def release(self) -> httpx.Response:
        return await self.http.delete(self.path, headers=self.auth)


def two_tenants() -> TenantsConfig:
    """``KEYS``' tenants, on a farm that also leases without a key."""
    return TenantsConfig(require_key=False, tenants=[
        Tenant(name=name, key_sha256=hash_key(key)) for name, key in KEYS.items()])


async def lease(http: httpx.AsyncClient, env: str, key: str | None = None,
                **body: Any) -> Lease:
    r = await http.post(f"/envs/{env}/leases", json=body,
                        headers={"X-Envfarm-Key": key} if key else {})
    assert r.status_code == 201, r.text
    return Lease(http, r.json())


async def batch(http: httpx.AsyncClient, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = await http.post("/batch/call", json={"calls": items})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def gone(body: dict[str, Any]) -> str | None:
    """Why a typed 410 error body (an HTTP answer's or a batch item's) says the lease is gone:
    ``lease_lost`` (its state was lost) or ``closed`` (it was released or expired); None if the
    body is not a 410."""
    error = body.get("error") or {}
    if error.get("kind") != "gone":
        return None
    lost = error.get("reason") == "lease_lost" or " is lost: " in error.get("message", "")
    return "lease_lost" if lost else "closed"
