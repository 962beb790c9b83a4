"""Tenants of a shared farm: API keys, quotas (429 + Retry-After), idempotency per tenant,
per-tenant metrics; and the flood test: one key floods while another trains."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cluster.compose import LocalFarm
from envfarm.client import Farm, reference_episode
from envfarm.errors import QuotaExceeded
from envfarm.farm import FarmConfig, PoolConfig, Tenant, TenantsConfig, hash_key
from tests.envfarm.farm.conftest import ENV, farm_client

KEY_A, KEY_B = "efk_alpha-key-0123456789", "efk_beta-key-9876543210"


def tenants(require_key: bool = True, **quota_a) -> TenantsConfig:
    return TenantsConfig(require_key=require_key, tenants=[
        Tenant(name="alpha", key_sha256=hash_key(KEY_A), **quota_a),
        Tenant(name="beta", key_sha256=hash_key(KEY_B))])


def key(k: str) -> dict[str, str]:
    return {"X-Envfarm-Key": k}


async def lease(c: httpx.AsyncClient, k: str | None = None, **body) -> httpx.Response:
    return await c.post(f"/envs/{ENV}/leases", json=body, headers=key(k) if k else {})


async def test_a_farm_that_requires_keys_refuses_leases_without_a_known_one(make_core):
    core = make_core(tenants=tenants())
    async with farm_client(core) as c:
        r = await lease(c)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "KeyMissing"
        assert "X-Envfarm-Key" in r.json()["error"]["message"]
        r = await lease(c, "efk_not-a-tenant")
        assert r.status_code == 403 and r.json()["error"]["type"] == "KeyInvalid"
        r = await c.post(f"/envs/{ENV}/leases:batch", json={"count": 2})
        assert r.status_code == 401
        assert not core.leases
        r = await lease(c, KEY_A)
        assert r.status_code == 201
        assert core.leases[r.json()["lease_id"]].tenant == "alpha"


async def test_an_open_farm_leases_without_a_key_but_not_with_a_wrong_one(make_core):
    core = make_core(tenants=tenants(require_key=False))
    async with farm_client(core) as c:
        r = await lease(c)
        assert r.status_code == 201
        assert core.leases[r.json()["lease_id"]].tenant == "anonymous"
        assert (await lease(c, "efk_wrong")).status_code == 403
        r = await lease(c, KEY_B)
        assert core.leases[r.json()["lease_id"]].tenant == "beta"


async def test_live_lease_quota_answers_429_until_one_is_released(make_core):
    core = make_core(tenants=tenants(max_leases=2))
    async with farm_client(core) as c:
        held = [(await lease(c, KEY_A)).json() for _ in range(2)]
        r = await lease(c, KEY_A)
        assert r.status_code == 429
        err = r.json()["error"]
        assert err["type"] == "QuotaExceeded" and err["kind"] == "rate_limited"
        assert err["quota"] == "max_leases" and err["tenant"] == "alpha"
        assert int(r.headers["Retry-After"]) >= 1
        assert (await lease(c, KEY_B)).status_code == 201  # another tenant is not affected
        # all or nothing: a batch over the quota creates no lease
        await c.delete(f"/envs/{ENV}/leases/{held[0]['lease_id']}",
                       headers={"Authorization": f"Bearer {held[0]['token']}"})
        before = len(core.leases)
        r = await c.post(f"/envs/{ENV}/leases:batch", json={"count": 2}, headers=key(KEY_A))
        assert r.status_code == 429 and len(core.leases) == before
        assert (await lease(c, KEY_A)).status_code == 201


async def test_lease_creation_rate_quota_says_when_to_retry(make_core):
    core = make_core(tenants=tenants(leases_per_s=2.0), pool=PoolConfig(warm=4))
    async with farm_client(core) as c:
        codes = [(await lease(c, KEY_A)).status_code for _ in range(2)]
        assert codes == [201, 201]  # a burst of one second's worth
        r = await lease(c, KEY_A)
        assert r.status_code == 429 and r.json()["error"]["quota"] == "leases_per_s"
        assert 0 < r.json()["error"]["retry_after_s"] <= 0.5
        await asyncio.sleep(r.json()["error"]["retry_after_s"] + 0.05)
        assert (await lease(c, KEY_A)).status_code == 201


async def test_call_rate_quota_holds_on_every_call_route(make_core):
    core = make_core(tenants=tenants(calls_per_s=3.0, burst_s=1.0))
    async with farm_client(core) as c:
        info = (await lease(c, KEY_A)).json()
        path, auth = f"/envs/{ENV}/leases/{info['lease_id']}", {
            "Authorization": f"Bearer {info['token']}"}
        mcp = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "list_wishlists", "arguments": {}}}
        answers = [
            await c.post(path + "/call", headers=auth, json={"tool": "list_wishlists"}),
            await c.post(info["mcp_url"], headers=mcp, json=call),
            await c.post(path + "/call", headers=auth,  # the framework path (odd field order)
                         json={"arguments": {}, "tool": "list_wishlists"}),
        ]
        assert [r.status_code for r in answers] == [200, 200, 200]
        for attempt in (
                c.post(path + "/call", headers=auth, json={"tool": "list_wishlists"}),
                c.post(info["mcp_url"], headers=mcp, json=call),
                c.post(info["mcp_url"], headers=mcp, json=[call])):  # a JSON-RPC batch
            r = await attempt
            assert r.status_code == 429, r.text
            assert r.json()["error"]["quota"] == "calls_per_s" and "Retry-After" in r.headers
        r = await c.post("/batch/call", json={"calls": [{
            "env": ENV, "lease_id": info["lease_id"], "token": info["token"],
            "tool": "list_wishlists", "arguments": {}}]})
        assert r.json()["results"][0]["error"]["status"] == 429
        # reading tools, verifying and releasing are not tool calls
        assert (await c.get(path + "/tools", headers=auth)).status_code == 200
        assert (await c.delete(path, headers=auth)).status_code == 200
        assert core.tenants.usage["alpha"].refused["calls_per_s"] == 4


async def test_idempotency_keys_are_scoped_per_tenant(make_core):
    core = make_core(tenants=tenants())
    async with farm_client(core) as c:
        a1 = (await lease(c, KEY_A, idempotency_key="job-1")).json()
        a2 = (await lease(c, KEY_A, idempotency_key="job-1")).json()
        b1 = (await lease(c, KEY_B, idempotency_key="job-1")).json()
        assert a1["lease_id"] == a2["lease_id"]  # a retry of alpha's request
        assert b1["lease_id"] != a1["lease_id"] and b1["token"] != a1["token"]
        assert core.tenants.usage["alpha"].leases == 1


async def test_per_tenant_counts_on_metrics_and_status_without_keys(make_core):
    core = make_core(tenants=tenants(max_leases=1))
    async with farm_client(core) as c:
        info = (await lease(c, KEY_A)).json()
        assert (await lease(c, KEY_A)).status_code == 429
        await c.post(f"/envs/{ENV}/leases/{info['lease_id']}/call", json={"tool": "list_wishlists"},
                     headers={"Authorization": f"Bearer {info['token']}"})
        text = (await c.get("/metrics")).text
        status = (await c.get("/status.json")).text
    assert f'envfarm_tenant_leases_active{{owner="{core.owner}",tenant="alpha"}} 1.0' in text
    assert f'envfarm_tenant_calls_total{{owner="{core.owner}",tenant="alpha"}} 1.0' in text
    assert 'tenant="alpha"} 1.0' in text and 'quota="max_leases"' in text
    assert '"tenant":"alpha"' in status.replace(" ", "")
    for secret in (KEY_A, hash_key(KEY_A), info["token"]):
        assert secret not in text and secret not in status


async def test_sdk_sends_its_key_and_waits_out_a_429(make_core):
    from envfarm.client._transport import ASGITransport
    from envfarm.farm import build_app

    core = make_core(tenants=tenants(calls_per_s=2.0))
    app = build_app(core, manage_core=False)
    async with (Farm(transport=ASGITransport(app), api_key=KEY_A, backoff_s=0.01) as farm,
                farm.lease(ENV) as held):
        for _ in range(4):  # two over the burst: each waits for its Retry-After
            await held.call("list_wishlists")
    assert core.tenants.usage["alpha"].calls == 4
    assert core.tenants.usage["alpha"].refused["calls_per_s"] >= 1
    async with Farm(transport=ASGITransport(app), api_key=None, retries=0) as anonymous:
        with pytest.raises(Exception) as caught:
            await anonymous.acquire(ENV)
        assert type(caught.value).__name__ == "KeyMissing"


def test_one_key_floods_while_another_trains(bundled_catalog):
    """The flood tenant hammers lease creation and calls over real HTTP; the trainer's
    reference episodes all verify completed 1.0 and the flood never holds more than its quota."""
    config = FarmConfig(envs=[ENV], pool=PoolConfig(warm=4, max_instances=64), tenants=TenantsConfig(
        require_key=True, tenants=[
            Tenant(name="flood", key_sha256=hash_key(KEY_A), max_leases=8, leases_per_s=50,
                   calls_per_s=100),
            Tenant(name="trainer", key_sha256=hash_key(KEY_B), max_leases=16)]))
    solution = bundled_catalog[ENV].solutions[0]

    async def run(url: str, core) -> tuple[list, dict[str, int], int]:
        stop = asyncio.Event()
        codes: dict[str, int] = {}
        peak = 0

        async def flood() -> None:
            nonlocal peak
            async with httpx.AsyncClient(base_url=url, headers=key(KEY_A)) as c:
                held: list[dict] = []
                while not stop.is_set():
                    r = await c.post(f"/envs/{ENV}/leases:batch", json={"count": 4})
                    codes[str(r.status_code)] = codes.get(str(r.status_code), 0) + 1
                    if r.status_code == 201:
                        held += r.json()
                    for info in held[-2:]:
                        r = await c.post(f"/envs/{ENV}/leases/{info['lease_id']}/call",
                                         json={"tool": "list_wishlists"},
                                         headers={"Authorization": f"Bearer {info['token']}"})
                        codes[str(r.status_code)] = codes.get(str(r.status_code), 0) + 1
                    peak = max(peak, core.tenants.usage["flood"].leases)

        async def train() -> list:
            async with Farm(url, api_key=KEY_B) as farm:
                return [await reference_episode(farm, ENV, 0, solution) for _ in range(6)]

        floods = [asyncio.create_task(flood()) for _ in range(3)]
        try:
            reports = await asyncio.wait_for(train(), 60)
        finally:
            stop.set()
            await asyncio.gather(*floods)
        return reports, codes, peak

    with LocalFarm(config) as farm:
        reports, codes, peak = asyncio.run(run(farm.url, farm.core))
    assert [(r.verdict.outcome.value, r.verdict.reward) for r in reports] == [
        ("completed", 1.0)] * 6
    assert codes.get("429", 0) > 0 and codes.get("201", 0) > 0
    assert codes.keys() <= {"200", "201", "429"}, codes
    assert peak <= 8


def test_quota_error_is_typed_in_the_sdk():
    from envfarm.client._errors import error_from_wire

    body = b'{"error": {"kind": "rate_limited", "type": "QuotaExceeded", "message": "m", ' \
           b'"retry_after_s": 0.2, "quota": "calls_per_s"}}'
    exc = error_from_wire(429, body)
    assert isinstance(exc, QuotaExceeded) and exc.retry_after_s == 0.2


def test_cli_makes_keys_and_requires_them_beyond_loopback(tmp_path, monkeypatch):
    import typer
    import yaml
    from typer.testing import CliRunner

    from cluster import cli_farm

    app = typer.Typer()
    cli_farm.register(app)
    runner = CliRunner()
    file = tmp_path / "tenants.yaml"
    made = runner.invoke(app, ["tenants", "new", "alpha", "--file", str(file),
                               "--max-leases", "64", "--calls-per-s", "500"])
    assert made.exit_code == 0, made.output
    new_key = made.stdout.strip().splitlines()[0]
    stored = file.read_text()
    assert new_key not in stored and hash_key(new_key) in stored
    assert yaml.safe_load(stored)["tenants"][0]["max_leases"] == 64
    assert runner.invoke(app, ["tenants", "new", "alpha", "--file", str(file)]).exit_code != 0

    # beyond loopback without keys: refused before anything listens
    refused = runner.invoke(app, ["serve", "--no-ray", "--host", "0.0.0.0", "--port", "1"])
    assert refused.exit_code != 0 and "API key" in refused.output
    monkeypatch.setenv("ENVFARM_API_KEYS", "beta:efk_beta-secret")
    out = tmp_path / "farm.yaml"
    wrote = runner.invoke(app, ["serve", "--tenants", str(file), "--host", "0.0.0.0",
                                "--write-config", str(out)])
    assert wrote.exit_code == 0, wrote.output
    text = out.read_text()
    assert "efk_beta-secret" not in text and hash_key("efk_beta-secret") in text
    assert "require_key: true" in text
    assert cli_farm.tenants_config(None, None, "127.0.0.1").require_key is False
    assert cli_farm.tenants_config(None, None, "::1").require_key is False
    assert cli_farm.tenants_config(None, None, "farm.internal").require_key is True
