"""The SDK against a real farm app: episodes, typed errors, safe retries, the sync wrapper."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from cluster.compose import LocalFarm, compose_core
from envfarm.client import (
    AgentError,
    ASGITransport,
    EnvError,
    Farm,
    LeaseForbidden,
    LeaseLost,
    LeaseNotFound,
    PoolExhausted,
    Reply,
    SyncFarm,
    TransportError,
    reference_episode,
)
from envfarm.errors import EnvfarmError, EnvNotFound
from envfarm.farm import FarmConfig, PoolConfig, build_app, free_port
from tests.envfarm.farm.conftest import lifespan_running

ENV = "hotel_booking_1"


@pytest.fixture
async def farm(bundled_catalog, hotel_runtime) -> AsyncIterator[Farm]:
    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2, max_instances=3)),
                    catalog=bundled_catalog, runtimes={ENV: hotel_runtime})
    app = build_app(core)
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app)) as f:
        yield f


async def test_reference_episode(farm, bundled_catalog):
    report = await reference_episode(farm, ENV, 0, bundled_catalog[ENV].solutions[0])
    assert report.verdict.reward == 1.0 and report.release == "closed"
    assert all(step.ok for step in report.steps) and report.tools > 10


async def test_lease_context_calls_and_releases(farm):
    async with farm.lease(ENV, task_idx=1) as lease:
        assert lease.info.task
        made = await lease.call("create_wishlist", {"name": "sdk"})
        assert made["name"] == "sdk"
        with pytest.raises(AgentError):
            await lease.call("no_such_tool")
        res = await lease.call_result("get_reservation", {"reservation_id": 424242})
        assert not res.ok and res.error.kind == "agent_error"
        await lease.reset()
        snap = await lease.snapshot()
        assert snap.startswith(b"SQLite format 3")
    assert lease.released
    with pytest.raises(LeaseLost):
        await lease.tools()


async def test_typed_errors(farm):
    with pytest.raises(EnvNotFound):
        await farm.acquire("nope_env")
    lease = await farm.acquire(ENV)
    lease.info = lease.info.model_copy(update={"token": "wrong"})
    with pytest.raises(LeaseForbidden):
        await lease.tools()
    ghost = lease.info.model_copy(update={"lease_id": lease.lease_id.split("-")[0] + "-00aa"})
    lease.info = ghost
    with pytest.raises(LeaseNotFound):
        await lease.tools()


async def test_pool_exhausted_is_typed(farm):
    held = [await farm.acquire(ENV) for _ in range(3)]
    with pytest.raises(PoolExhausted):
        await farm.acquire(ENV)
    await held[0].release()
    await asyncio.sleep(0.02)
    again = await farm.acquire(ENV, wait_s=1.0)
    assert again.lease_id not in {h.lease_id for h in held}


async def test_batch_call(farm):
    a, b = await farm.acquire(ENV), await farm.acquire(ENV)
    out = await farm.batch_call([(a, "list_wishlists", {}), (b, "nope", {})])
    assert out[0].ok and out[1].error.kind == "agent_error"
    await b.release()
    out = await farm.batch_call([(b, "list_wishlists", {})])
    assert isinstance(out[0], LeaseLost)


class _Flaky:
    """A transport whose first n requests never leave (connect errors)."""

    def __init__(self, inner, failures: int) -> None:
        self.inner, self.failures, self.seen = inner, failures, []

    async def request(self, method, path, *, json=None, headers=None) -> Reply:
        self.seen.append((method, path))
        if self.failures:
            self.failures -= 1
            raise TransportError("connect refused", sent=False)
        return await self.inner.request(method, path, json=json, headers=headers)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Lost(_Flaky):
    """A transport that loses the reply of the first n requests (they may have run)."""

    async def request(self, method, path, *, json=None, headers=None) -> Reply:
        self.seen.append((method, path))
        reply = await self.inner.request(method, path, json=json, headers=headers)
        if self.failures:
            self.failures -= 1
            raise TransportError("read timeout", sent=True)
        return reply


async def test_retries_only_where_safe(bundled_catalog, hotel_runtime):
    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2)), catalog=bundled_catalog,
                    runtimes={ENV: hotel_runtime})
    inner = ASGITransport(build_app(core))
    async with Farm("http://farm", transport=_Flaky(inner, 2), backoff_s=0) as farm:
        lease = await farm.acquire(ENV)  # retried twice: nothing had left
        assert len(farm.transport.seen) == 3
    lost = _Lost(ASGITransport(build_app(core)), 1)
    async with Farm("http://farm", transport=lost, backoff_s=0) as farm:
        lease = await farm.acquire(ENV)  # may have run: retried with the same idempotency key
        assert len(core.leases) == 2  # the first lease + this one, not a third
        lost.failures = 1
        with pytest.raises(TransportError):  # a tool call that may have run is not retried
            await lease.call("create_wishlist", {"name": "once"})
        assert [p for _, p in lost.seen].count(lease.path + "/call") == 1


class _IngressGaveUp(_Flaky):
    """The ingress answers the first n requests itself, as Serve's HAProxy answers a queue
    timeout: a bare-text 500 (the request never reached the farm)."""

    async def request(self, method, path, *, json=None, headers=None) -> Reply:
        self.seen.append((method, path))
        if self.failures:
            self.failures -= 1
            return Reply(500, b"Internal Server Error", {"content-type": "text/plain"})
        return await self.inner.request(method, path, json=json, headers=headers)


async def test_an_ingress_bare_500_is_retried_where_safe_and_typed_500s_are_not(
        bundled_catalog, hotel_runtime):
    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2)), catalog=bundled_catalog,
                        runtimes={ENV: hotel_runtime})
    busy = _IngressGaveUp(ASGITransport(build_app(core)), 2)
    async with Farm("http://farm", transport=busy, backoff_s=0) as farm:
        lease = await farm.acquire(ENV)  # safe (idempotency key): asked again, twice
        assert len(busy.seen) == 3 and len(core.leases) == 1
        busy.failures = 1
        with pytest.raises(TransportError, match="HTTP 500"):  # may have run: not sent twice
            await lease.call("create_wishlist", {"name": "once"})
        assert [p for _, p in busy.seen].count(lease.path + "/call") == 1
        busy.failures = 5  # more than the retry budget: the bare answer surfaces, typed
        with pytest.raises(TransportError, match="Internal Server Error"):
            await farm.envs()
        assert busy.failures == 1  # 1 try + 3 retries

    class _FarmSays500(_Flaky):  # the farm's own typed 500 is an answer, not the ingress's
        async def request(self, method, path, *, json=None, headers=None) -> Reply:
            self.seen.append((method, path))
            return Reply(500, b'{"error": {"kind": "internal", "message": "verifier broke"}}',
                         {"content-type": "application/json"})

    said = _FarmSays500(ASGITransport(build_app(core)), 0)
    async with Farm("http://farm", transport=said, backoff_s=0) as farm:
        with pytest.raises(EnvfarmError, match="verifier broke") as typed:
            await farm.envs()
        assert not isinstance(typed.value, TransportError) and len(said.seen) == 1


@pytest.fixture(scope="module")
def local_farm(bundled_catalog) -> Iterator[LocalFarm]:
    with LocalFarm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2))) as running:
        yield running


def test_sync_wrapper_over_real_http(local_farm):
    with SyncFarm(local_farm.url) as farm:
        assert ENV in {e.name for e in farm.envs()}
        with farm.lease(ENV, task_idx=0) as lease:
            assert lease.call("create_wishlist", {"name": "sync"})["name"] == "sync"
            assert lease.verify().reward == 0.0
            with pytest.raises(EnvError.__mro__[1]):  # ToolCallError: agent or env error
                lease.call("get_reservation", {"reservation_id": 10**9})


async def test_sync_wrapper_refuses_inside_a_loop(local_farm):
    with pytest.raises(RuntimeError, match="event loop"):
        SyncFarm(local_farm.url)


async def test_requests_opt_out_of_serves_disconnect_watch():
    """On the wire, every SDK request asks Serve not to watch for a hang-up (see
    NO_DISCONNECT_WATCH): read back by a bare loopback server."""
    import asyncio

    from envfarm.client._transport import HTTPTransport

    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = HTTPTransport(f"http://127.0.0.1:{port}")
    try:
        reply = await transport.request("POST", "/envs/x/leases", json={},
                                        headers={"Authorization": "Bearer t"})
    finally:
        await transport.aclose()
        server.close()
        await server.wait_closed()
    assert reply.status == 200
    (head,) = seen
    lines = head.decode("latin-1").lower().split("\r\n")
    assert "x-request-disconnect-disabled: ?1" in lines
    assert "authorization: bearer t" in lines  # per-request headers still go with it


class _Counting:
    """The farm's front transport, counting what goes through it."""

    def __init__(self, url: str) -> None:
        from envfarm.client._transport import HTTPTransport

        self.inner, self.paths = HTTPTransport(url), []

    async def request(self, method, path, **kw):
        self.paths.append(path)
        return await self.inner.request(method, path, **kw)

    async def aclose(self):
        await self.inner.aclose()


async def _hang_up_server() -> tuple[asyncio.AbstractServer, str]:
    """A listener that reads a request and closes without answering: an owner dying mid-call."""
    async def handle(reader, writer):
        await reader.read(1 << 16)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_direct_client_sends_a_leases_requests_to_its_owner(local_farm):
    """``direct=True``: a lease naming its owner's listener is served there, none of its
    requests through the front; a lease naming none (every ``--no-ray`` lease) goes by the front."""
    front = _Counting(local_farm.url)
    async with Farm(local_farm.url, transport=front, direct=True) as farm:
        plain = await farm.acquire(ENV)
        assert plain.info.direct_url is None  # one process: no owner listener to name
        await plain.call("create_wishlist", {"name": "via-front"})
        assert plain.path + "/call" in front.paths
        # the same app standing in for an owner's listener
        info = plain.info.model_copy(update={"direct_url": local_farm.url})
        owned = type(plain)(farm, info)
        front.paths.clear()
        assert (await owned.call("list_wishlists"))["wishlists"]
        await owned.tools()
        (listed,) = await farm.batch_call([(owned, "list_wishlists", {})])
        assert listed.ok and listed.result["wishlists"]
        await owned.release()
        assert front.paths == []


async def test_a_direct_client_falls_back_to_the_front_when_the_owner_does_not_answer(local_farm):
    from envfarm.wire import LeaseInfo

    server, hang_up = await _hang_up_server()
    closed = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there
    try:
        async with Farm(local_farm.url, direct=True, backoff_s=0) as farm:
            lease = await farm.acquire(ENV)
            # refused: nothing left, so even a tool call goes on through the front
            refused = type(lease)(farm, LeaseInfo.model_validate(
                {**lease.info.model_dump(), "direct_url": closed}))
            assert (await refused.call("create_wishlist", {"name": "x"}))["name"] == "x"
            assert refused._direct is None  # the front from now on
            # a batch of calls likewise: refused at the owner, sent through the front
            refused = type(lease)(farm, refused.info)
            (done,) = await farm.batch_call([(refused, "create_wishlist", {"name": "y"})])
            assert done.ok and done.result["name"] == "y" and refused._direct is None
            # lost in flight: a tool call that may have run is not sent again ...
            cut = type(lease)(farm, LeaseInfo.model_validate(
                {**lease.info.model_dump(), "direct_url": hang_up}))
            with pytest.raises(TransportError):
                await cut.call("create_wishlist", {"name": "maybe"})
            assert cut._direct is None
            cut = type(lease)(farm, cut.info)
            with pytest.raises(TransportError):  # a batch lost in flight is not sent again either
                await farm.batch_call([(cut, "create_wishlist", {"name": "maybe2"})])
            assert cut._direct is None
            # ... and where the lease is gone, the front's typed 410 says so
            await lease.release()
            gone = type(lease)(farm, LeaseInfo.model_validate(
                {**lease.info.model_dump(), "direct_url": hang_up}))
            with pytest.raises(LeaseLost):
                await gone.call("create_wishlist", {"name": "late"})
    finally:
        server.close()
        await server.wait_closed()

