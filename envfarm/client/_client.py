"""The async SDK: ``Farm(url)`` and its leases.

    async with Farm("http://127.0.0.1:8000") as farm:
        async with farm.lease("content_platform_1", task_idx=0) as lease:
            tools = await lease.tools()
            result = await lease.call("search_channels", {"query": "news"})
            verdict = await lease.verify()

Retries only where they cannot duplicate work: a request that never left (connect errors) is
always retried; reads, releases and lease creation (made idempotent with a generated key) are
also retried after timeouts and 5xx. Tool calls and resets that may have run are not.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self

from envfarm.client._errors import SDK_NAMES, call_error, error_from_wire
from envfarm.client._transport import HTTPTransport, Reply, Transport
from envfarm.errors import (
    EnvfarmError,
    PoolExhausted,
    QuotaExceeded,
    TransportError,
    error_from_body,
)
from envfarm.models import CallResult, ToolSpec
from envfarm.wire import (
    BatchError,
    BatchResponse,
    BatchResult,
    EnvDetail,
    EnvSummary,
    LeaseInfo,
    QuarantinedTask,
    ReleaseResponse,
    VerifyResponse,
    by_owner,
    owner_of,
)

#: Where the SDK (and ``envfarm rollout/train``) finds a farm API key when none is passed.
API_KEY_ENV = "ENVFARM_API_KEY"


class Farm:
    """A farm reached over HTTP (or any ``Transport``).

    ``api_key``: the tenant's farm API key (default: ``$ENVFARM_API_KEY``), sent as
    ``X-Envfarm-Key``; a farm that listens beyond loopback needs one to create leases."""

    def __init__(self, url: str = "http://127.0.0.1:8000", *, transport: Transport | None = None,
                 max_connections: int = 1024, timeout_s: float = 60.0, retries: int = 3,
                 backoff_s: float = 0.2, api_key: str | None = None,
                 direct: bool = False) -> None:
        """``direct``: send each lease's requests straight to the replica that owns it where
        the farm names one (``LeaseInfo.direct_url``: multi-replica pools behind a Door), past
        HAProxy and the Door. For clients inside the cluster: the address is the replica's node.
        Where it does not answer, the lease's requests go through ``url`` again. New leases
        then take turns among ``url`` (the farm places them by load, and names new replicas)
        and the listeners already named for that env, so the Door carries a share of them."""
        self.url = url.rstrip("/")
        self.transport = transport or HTTPTransport(url, max_connections=max_connections,
                                                    timeout_s=timeout_s)
        self.retries = retries
        self.backoff_s = backoff_s
        self.api_key = api_key or os.environ.get(API_KEY_ENV) or None
        self.direct = direct
        self._max_connections, self._timeout_s = max_connections, timeout_s
        self._owners: dict[str, Transport] = {}  # direct_url -> its transport
        self._listeners: dict[str, list[str]] = {}  # env -> direct_urls named, in order
        self._turn = 0  # whose turn a new lease is (direct): the front's, or a listener's

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.transport.aclose()
        for transport in self._owners.values():
            await transport.aclose()
        self._owners.clear()

    def _owner_transport(self, info: LeaseInfo) -> Transport | None:
        """Where a lease's requests go straight to its owner (``direct``), else None."""
        if not self.direct or not info.direct_url:
            return None
        return self._transport_to(info.direct_url.rstrip("/"))

    def _transport_to(self, url: str) -> Transport:
        if url not in self._owners:
            self._owners[url] = HTTPTransport(url, max_connections=self._max_connections,
                                              timeout_s=self._timeout_s)
        return self._owners[url]

    # -- plumbing --------------------------------------------------------------------------------
    async def _request(self, method: str, path: str, *, json_body: Any = None,
                       token: str | None = None, safe: bool = False,
                       via: Transport | None = None) -> Reply:
        """``via``: a lease owner's own transport; a transport error there is raised at once
        (the caller goes through the farm's front instead)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if self.api_key:
            headers["X-Envfarm-Key"] = self.api_key
        attempt = 0
        while True:
            try:
                reply = await (via or self.transport).request(method, path, json=json_body,
                                                              headers=headers)
            except TransportError as exc:
                if via is None and attempt < self.retries and (
                        safe or exc.fields.get("sent") is False):
                    attempt += 1
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                    continue
                raise
            if reply.status < 400:
                return reply
            if reply.status == 429 and attempt < self.retries:
                # Refused over quota before anything ran: safe to send again when told.
                attempt += 1
                await asyncio.sleep(_retry_after(reply, self.backoff_s))
                continue
            retryable = safe and (reply.status in (502, 503, 504) or _ingress_error(reply))
            if retryable and attempt < self.retries:
                attempt += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                continue
            raise error_from_wire(reply.status, reply.body)

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        return _decode(await self._request(method, path, **kw), method, path)

    # -- catalog ---------------------------------------------------------------------------------
    async def envs(self) -> list[EnvSummary]:
        return [EnvSummary.model_validate(e) for e in await self._json("GET", "/envs", safe=True)]

    async def env(self, name: str) -> EnvDetail:
        return EnvDetail.model_validate(await self._json("GET", f"/envs/{name}", safe=True))

    async def warm(self, *names: str) -> list[EnvDetail]:
        """Load these envs now (on-demand farms), so their first leases skip the cold start;
        an env that fails to load raises ``EnvBroken``."""
        return [EnvDetail.model_validate(await self._json("POST", f"/envs/{n}/warm", safe=True))
                for n in names]

    async def healthz(self) -> dict[str, Any]:
        return await self._json("GET", "/healthz", safe=True)

    async def quarantined(self) -> list[QuarantinedTask]:
        """Tasks out of rotation (a lease for one raises ``TaskQuarantined``): skip them."""
        return [QuarantinedTask.model_validate(q) for q in await self._json("GET", "/quarantine", safe=True)]

    async def lift_quarantine(self, env: str, task_idx: int | None = None) -> list[QuarantinedTask]:
        """Put a task (None: the env type and all its tasks) back into rotation; what was lifted."""
        data = await self._json("POST", "/quarantine/lift", json_body={"env": env, "task_idx": task_idx},
                                safe=True)
        return [QuarantinedTask.model_validate(q) for q in data]

    # -- leases ----------------------------------------------------------------------------------
    async def acquire(self, env: str, *, task_idx: int | None = None, ttl_s: float | None = None,
                      idempotency_key: str | None = None, wait_s: float = 0.0) -> Lease:
        """A new lease (release it yourself, or use ``lease()``). ``wait_s``: retry a full pool."""
        body = {"task_idx": task_idx, "ttl_s": ttl_s,
                "idempotency_key": idempotency_key or uuid.uuid4().hex}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                data = await self._granting(env, "leases", body)
                return Lease(self, LeaseInfo.model_validate(data))
            except (PoolExhausted, QuotaExceeded):
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(min(1.0, max(0.05, deadline - loop.time())))

    @asynccontextmanager
    async def lease(self, env: str, *, task_idx: int | None = None, ttl_s: float | None = None,
                    idempotency_key: str | None = None) -> AsyncIterator[Lease]:
        """A lease released on exit, however the block ends."""
        lease = await self.acquire(env, task_idx=task_idx, ttl_s=ttl_s,
                                   idempotency_key=idempotency_key)
        try:
            yield lease
        finally:
            try:
                await lease.release()
            except EnvfarmError:
                pass  # already gone: nothing to give back

    async def acquire_many(self, env: str, count: int, *, task_idx: int | None = None,
                           ttl_s: float | None = None) -> list[Lease]:
        """``count`` leases in one request (e.g. a GRPO group on one task)."""
        body = {"count": count, "task_idx": task_idx, "ttl_s": ttl_s,
                "idempotency_key": uuid.uuid4().hex}
        data = await self._granting(env, "leases:batch", body)
        return [Lease(self, LeaseInfo.model_validate(d)) for d in data]

    async def _granting(self, env: str, what: str, body: dict[str, Any]) -> Any:
        """POST ``/envs/<env>/<what>`` (new leases, idempotent by ``body``'s key) where it is
        the turn of: the front, or on a ``direct`` farm an env's listener already named (its
        replica makes them; a listener that does not connect is forgotten, a full one leaves
        them to the front). The answer's leases name their listener."""
        path = f"/envs/{env}/{what}"
        known = self._listeners.get(env, []) if self.direct else []
        self._turn = (self._turn + 1) % (len(known) + 1)
        if self._turn:
            url = known[self._turn - 1]
            try:
                data = await self._json("POST", path, json_body=body, safe=True,
                                        via=self._owners[url])
            except TransportError as exc:
                if exc.fields.get("sent") is not False:
                    raise  # it may have made them: never asked again elsewhere
                self._forget(url)
            except PoolExhausted:
                pass  # that replica is full: the front places them
            else:
                for info in _infos(data):
                    info["direct_url"] = info.get("direct_url") or url  # it does not name itself
                return data
        data = await self._json("POST", path, json_body=body, safe=True)
        for info in _infos(data) if self.direct else []:
            url = (info.get("direct_url") or "").rstrip("/")
            if url and url not in known:
                self._listeners[env] = known = [*known, url]
                self._transport_to(url)
        return data

    def _forget(self, url: str) -> None:
        """A listener that refused a connection: its replica is gone, no new leases there."""
        for known in self._listeners.values():
            if url in known:
                known.remove(url)

    async def batch_call(self, calls: Sequence[tuple[Lease, str, dict[str, Any]]]
                         ) -> list[CallResult | EnvfarmError]:
        """Many leases' calls: one request per owner replica (one hop through Serve; on a
        ``direct`` farm straight to the owner's listener), sent concurrently; per item a result
        or the error it hit, in the order given."""
        async def send(env: str, owner: str, group: list[tuple[Lease, str, dict[str, Any]]]
                       ) -> list[CallResult | EnvfarmError]:
            body = {"calls": [{"env": lease.env, "lease_id": lease.lease_id,
                               "token": lease.token, "tool": tool, "arguments": arguments}
                              for lease, tool, arguments in group]}
            path = f"/envs/{env}/owners/{owner}/batch"
            via = group[0][0]._direct  # one owner, one listener
            try:
                reply = await self._request("POST", path, json_body=body, via=via)
            except TransportError as exc:
                if via is None:
                    raise
                for lease, _, _ in group:
                    lease._direct = None  # the front from now on, as for a lease's own calls
                if exc.fields.get("sent") is not False:
                    raise  # lost in flight: its calls may have run, never sent twice
                reply = await self._request("POST", path, json_body=body)  # the front knows
            data = BatchResponse.model_validate(_decode(reply, "POST", path))
            return [item.result if item.result is not None else _item_error(item)
                    for item in data.results]

        return await by_owner(calls, lambda c: (c[0].env, c[0].lease_id), send)


def _decode(reply: Reply, method: str, path: str) -> Any:
    try:
        return json.loads(reply.body)
    except ValueError as exc:
        raise TransportError(f"farm answered non-JSON to {method} {path}") from exc


def _infos(data: Any) -> list[dict[str, Any]]:
    """The lease infos of a lease-granting answer (one, or a list of them)."""
    return [i for i in (data if isinstance(data, list) else [data]) if isinstance(i, dict)]


def _ingress_error(reply: Reply) -> bool:
    """A 5xx that is not the farm's own typed answer: the ingress in front of it gave up (Serve's
    HAProxy answers its 502/503/504, a queue timeout say, as a bare-text 500)."""
    if reply.status < 500:
        return False
    try:
        error = json.loads(reply.body)["error"]
    except (ValueError, KeyError, TypeError):
        return True
    return not isinstance(error, dict)


def _retry_after(reply: Reply, default: float) -> float:
    """The body's exact ``retry_after_s``, else the whole-second header, capped at 30 s."""
    try:
        wait = json.loads(reply.body)["error"].get("retry_after_s")
    except (ValueError, KeyError, TypeError, AttributeError):
        wait = None
    try:
        wait = float(wait if wait is not None else reply.headers.get("retry-after", default))
    except (TypeError, ValueError):
        wait = default
    return min(30.0, max(0.0, wait))


def _item_error(item: BatchResult) -> EnvfarmError:
    err = item.error or BatchError(kind="internal", message="no result and no error", status=500)
    return error_from_body(err.status, {**err.model_dump(exclude={"status"}),
                                        "lease_id": item.lease_id}, SDK_NAMES)


class Lease:
    """One leased instance: its id, token and the calls it accepts."""

    def __init__(self, farm: Farm, info: LeaseInfo) -> None:
        self.farm = farm
        self.info = info
        self.released = False
        self._direct = farm._owner_transport(info)

    async def _request(self, method: str, suffix: str = "", **kw: Any) -> Reply:
        """A request of this lease: straight to its owner where the farm is ``direct``; once
        that fails to connect (or a retryable request fails there), elsewhere from then on:
        another replica's listener of the env where one is known (it hands the request on to
        the owner), else the farm's front; either knows whether the owner still lives (a typed
        410 if not). After a replica dies its leases' requests then skip the Door."""
        path = self.path + suffix
        if self._direct is not None:
            try:
                return await self.farm._request(method, path, token=self.token,
                                                via=self._direct, **kw)
            except TransportError as exc:
                self._direct = None
                refused = exc.fields.get("sent") is False
                if refused and self.info.direct_url:
                    self.farm._forget(self.info.direct_url.rstrip("/"))  # its replica is gone
                if not (kw.get("safe") or refused):
                    # Lost in flight: if the owner died, a typed 410 says so.
                    await self._elsewhere("GET", self.path + "/tools", safe=True)
                    raise
            return await self._elsewhere(method, path, **kw)
        return await self.farm._request(method, path, token=self.token, **kw)

    async def _elsewhere(self, method: str, path: str, **kw: Any) -> Reply:
        """A request of a lease whose owner's listener failed: to another listener of the env
        (one that refuses too is forgotten), else through the front."""
        for url in list(self.farm._listeners.get(self.env, [])):
            try:
                return await self.farm._request(method, path, token=self.token,
                                                via=self.farm._transport_to(url), **kw)
            except TransportError as exc:
                if exc.fields.get("sent") is not False:
                    raise
                self.farm._forget(url)
        return await self.farm._request(method, path, token=self.token, **kw)

    async def _json(self, method: str, suffix: str = "", **kw: Any) -> Any:
        return _decode(await self._request(method, suffix, **kw), method, self.path + suffix)

    @property
    def lease_id(self) -> str:
        return self.info.lease_id

    @property
    def env(self) -> str:
        return self.info.env

    @property
    def token(self) -> str:
        return self.info.token

    @property
    def mcp_url(self) -> str:
        """The lease's MCP endpoint, its credential in the path (no header needed)."""
        if "://" in self.info.mcp_url:
            return self.info.mcp_url
        return self.farm.url + self.info.mcp_url

    @property
    def path(self) -> str:
        return f"/envs/{self.env}/leases/{self.lease_id}"

    def __repr__(self) -> str:
        return f"<Lease {self.lease_id} of {self.env}>"

    async def tools(self) -> list[ToolSpec]:
        data = await self._json("GET", "/tools", safe=True)
        return [ToolSpec.model_validate(t) for t in data]

    async def call_result(self, tool: str, arguments: dict[str, Any] | None = None
                          ) -> CallResult:
        """The call's outcome, agent and env errors included (never raised)."""
        data = await self._json("POST", "/call",
                                json_body={"tool": tool, "arguments": arguments or {}})
        return CallResult.model_validate(data)

    async def call(self, tool: str, arguments: dict[str, Any] | None = None) -> Any:
        """The tool's result; raises ``AgentError`` / ``EnvError`` when the call failed."""
        res = await self.call_result(tool, arguments)
        if not res.ok:
            err = res.error
            raise call_error(err.kind if err else "env_error",
                             err.message if err else "call failed", lease_id=self.lease_id,
                             tool=tool, status=res.status)
        return res.result

    async def reset(self) -> None:
        await self._json("POST", "/reset")

    async def verify(self, task_idx: int | None = None, final_answer: str | None = None,
                     trajectory: Any = None) -> VerifyResponse:
        """The verdict on this lease's episode. ``trajectory`` (a ``judge.Trajectory`` or its
        JSON) is what a farm on the llm reward path shows its judge; the code path ignores it."""
        if hasattr(trajectory, "model_dump"):
            trajectory = trajectory.model_dump(mode="json")
        body = {"task_idx": task_idx, "final_answer": final_answer, "trajectory": trajectory}
        return VerifyResponse.model_validate(
            await self._json("POST", "/verify", json_body=body, safe=True))

    async def fork(self, ttl_s: float | None = None) -> Lease:
        """A new lease (same tenant, same task) whose database is this lease's state now and
        whose steps so far are kept for verification; this lease goes on untouched. Retried
        safely: an idempotency key makes a repeat return the same fork."""
        body = {"ttl_s": ttl_s, "idempotency_key": uuid.uuid4().hex}
        info = LeaseInfo.model_validate(await self._json("POST", "/fork", json_body=body,
                                                         safe=True))
        if (info.direct_url is None and self._direct is not None
                and owner_of(info.lease_id) == owner_of(self.lease_id)):
            # asked of the owner itself, which does not name its own listener: the parent's
            info = info.model_copy(update={"direct_url": self.info.direct_url})
        return Lease(self.farm, info)

    async def snapshot(self, which: str = "current") -> bytes:
        reply = await self._request("GET", f"/snapshot?which={which}", safe=True)
        return reply.body

    async def release(self) -> ReleaseResponse:
        data = await self._json("DELETE", safe=True)
        self.released = True
        return ReleaseResponse.model_validate(data)
