"""The SDK transports bench_rollout compares beyond the SDK's own (aiohttp, httpx): coalescing
owner batches, and in-cluster DeploymentHandles."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from typing import Any

from envfarm.client import Reply


class CoalescingTransport:
    """Tool calls that concurrent episodes issue in the same event-loop tick go to the farm as
    one owner-batch request (``POST /envs/{env}/owners/{owner}/batch``); everything else passes
    through. Each caller still gets its own reply, exactly as the per-call endpoint answers."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.pending: dict[tuple[str, str], list[tuple[dict, asyncio.Future]]] = defaultdict(list)
        self.batches = 0
        self.calls = 0

    async def request(self, method: str, path: str, *, json: Any = None,
                      headers: dict[str, str] | None = None) -> Reply:
        parts = path.split("/")  # /envs/{env}/leases/{id}/call
        if method != "POST" or len(parts) != 6 or parts[5] != "call" or parts[3] != "leases":
            return await self.inner.request(method, path, json=json, headers=headers)
        env, lease_id = parts[2], parts[4]
        token = (headers or {}).get("Authorization", "").removeprefix("Bearer ")
        item = {"env": env, "lease_id": lease_id, "token": token, "tool": json["tool"],
                "arguments": json.get("arguments") or {}}
        fut = asyncio.get_running_loop().create_future()
        key = (env, lease_id.rpartition("-")[0])
        if not self.pending[key]:
            asyncio.get_running_loop().call_soon(
                lambda k=key: asyncio.ensure_future(self._flush(k)))
        self.pending[key].append((item, fut))
        return await fut

    async def _flush(self, key: tuple[str, str]) -> None:
        batch = self.pending.pop(key, [])
        if not batch:
            return
        self.batches += 1
        self.calls += len(batch)
        env, owner = key
        try:
            reply = await self.inner.request("POST", f"/envs/{env}/owners/{owner}/batch",
                                             json={"calls": [item for item, _ in batch]})
        except Exception as exc:  # every caller sees the transport failure
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        if reply.status >= 400:
            for _, fut in batch:
                fut.set_result(reply)
            return
        for (_, fut), res in zip(batch, json_loads(reply.body)["results"]):
            if res.get("result") is not None:
                fut.set_result(Reply(200, json_dumps(res["result"])))
            else:
                err = res.get("error") or {}
                fut.set_result(Reply(err.get("status", 500), json_dumps(
                    {"error": {"kind": err.get("kind", ""), "message": err.get("message", ""),
                               "lease_id": res.get("lease_id")}})))

    async def aclose(self) -> None:
        await self.inner.aclose()


class HandleTransport(CoalescingTransport):
    """In-cluster: leases, coalesced calls and releases over Serve DeploymentHandles (no HTTP
    proxy); the rest (tools, verify) over HTTP."""

    def __init__(self, inner: Any, incluster: Any) -> None:
        super().__init__(inner)
        self.farm = incluster
        self.leases: dict[str, Any] = {}

    async def request(self, method: str, path: str, *, json: Any = None,
                      headers: dict[str, str] | None = None) -> Reply:
        parts = path.split("/")
        if method == "POST" and len(parts) == 4 and parts[3] == "leases:batch":
            body = {k: v for k, v in (json or {}).items()
                    if v is not None and k not in ("count", "idempotency_key")}
            infos = await asyncio.gather(*(self.farm.lease(parts[2], **body)
                                           for _ in range(int((json or {}).get("count", 1)))))
            self.leases.update((i.lease_id, i) for i in infos)
            return Reply(201, json_dumps([i.model_dump(mode="json") for i in infos]))
        if method == "POST" and len(parts) == 4 and parts[3] == "leases":
            body = {k: v for k, v in (json or {}).items() if v is not None}
            info = await self.farm.lease(parts[2], **body)
            self.leases[info.lease_id] = info
            return Reply(201, info.model_dump_json().encode())
        if method == "DELETE" and len(parts) == 5 and parts[3] == "leases":
            info = self.leases.pop(parts[4], None)
            if info is not None:
                res = await self.farm.release(info)
                return Reply(200, res.model_dump_json().encode())
        return await super().request(method, path, json=json, headers=headers)

    async def _flush(self, key: tuple[str, str]) -> None:
        batch = self.pending.pop(key, [])
        if not batch:
            return
        self.batches += 1
        self.calls += len(batch)
        try:
            calls = [(self.leases[item["lease_id"]], item["tool"], item["arguments"])
                     for item, _ in batch]
            results = await self.farm.call_many(calls)
        except Exception as exc:
            for _, fut in batch:
                fut.set_exception(exc)
            return
        for (_, fut), res in zip(batch, results):
            if res.result is not None:
                fut.set_result(Reply(200, res.result.model_dump_json().encode()))
            else:
                err = res.error
                fut.set_result(Reply(err.status if err else 500, json_dumps(
                    {"error": {"kind": err.kind if err else "", "lease_id": res.lease_id,
                               "message": err.message if err else "call failed"}})))


def json_loads(body: bytes) -> Any:
    return json.loads(body)


def json_dumps(value: Any) -> bytes:
    return json.dumps(value).encode()
