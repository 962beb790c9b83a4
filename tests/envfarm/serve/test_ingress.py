"""Serve's HAProxy ingress (the default) and the Python proxy behind a flag: how pool apps are
laid out for each, that owner routing stays exact on both HAProxy layouts (one replica as its
own ingress; several behind a Door), and that a request forced onto a replica that does not own
its lease is never served from a fresh state."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cluster.haproxy import haproxy_config, haproxy_servers
from envfarm.farm import FarmConfig
from envfarm.serve import DeploymentOptions
from envfarm.serve._ingress import (
    ENV_HAPROXY,
    HAPROXY_TUNING,
    RAY_TUNING,
    IngressMismatch,
    behind_door,
    current_proxy,
    farm_env,
    ingress_env,
    pool_application,
    use_ingress,
)

REPO = Path(__file__).resolve().parents[3]
FAST = "hotel_booking_1"  # one replica: its own ingress under HAProxy
DOORED = "personal_banking_1"  # two replicas: behind a Door under HAProxy


def _ingress(app):
    dep = app._bound_deployment
    return dep.name, dep._deployment_config.request_router_config.is_default_request_router()


def test_pool_layout_per_ingress_mode():
    farm = FarmConfig(envs=[FAST]).model_dump()
    one, three = DeploymentOptions(), DeploymentOptions(num_replicas=3)
    auto = DeploymentOptions(autoscaling_config={"min_replicas": 1, "max_replicas": 4})
    # Python proxy: the pool is the ingress and routes by owner.
    assert _ingress(pool_application(farm, three, "python")) == ("pool", False)
    # HAProxy, one replica: the pool is the ingress with Serve's default router (HAProxy
    # bypasses any other), fine since that replica owns every live lease.
    assert _ingress(pool_application(farm, one, "haproxy")) == ("pool", True)
    # HAProxy, several replicas: a Door is the ingress; the pool behind keeps LeaseRouter.
    for opts in (three, auto):
        app = pool_application(farm, opts, "haproxy")
        assert _ingress(app) == ("door", True)
        (pool,) = [a for a in app._bound_deployment.init_args if hasattr(a, "_bound_deployment")]
        assert _ingress(pool) == ("pool", False)
    assert [behind_door(o, "haproxy") for o in (one, three, auto)] == [False, True, True]
    assert not behind_door(three, "python")


def _logging(app) -> tuple[str, bool]:
    cfg = app._bound_deployment._deployment_config.logging_config
    return cfg["log_level"], cfg["enable_access_log"]


def test_every_deployment_logs_at_warning_without_access_log_unless_asked(bundled_catalog):
    """Pool, Door and front; built in code and from a written Serve config (`--access-log`)."""
    from envfarm.farm import PoolConfig
    from envfarm.serve import ServeOptions
    from envfarm.serve.apps import front_app, pool_app, serve_config

    farm = FarmConfig(envs=[FAST]).model_dump()
    for on, expected in ((False, ("WARNING", False)), (True, ("INFO", True))):
        door = pool_application(farm, DeploymentOptions(num_replicas=2, access_log=on),
                                "haproxy")
        (pool,) = [a for a in door._bound_deployment.init_args
                   if hasattr(a, "_bound_deployment")]
        assert _logging(door) == _logging(pool) == expected
        options = ServeOptions(deployment=DeploymentOptions(access_log=on))
        written = serve_config(FarmConfig(envs=[FAST], pool=PoolConfig(warm=2)), options)
        *pools, front = written["applications"]
        assert _logging(front_app(front["args"])) == expected
        assert {_logging(pool_app(a["args"])) for a in pools} == {expected}


def test_mode_env_round_trips():
    assert current_proxy(ingress_env("haproxy")) == "haproxy"
    assert current_proxy(ingress_env("python")) == "python"
    assert current_proxy({}) == "python"  # Serve's own default


def test_manifest_and_cluster_scripts_run_haproxy_ingress():
    manifest = yaml.safe_load((REPO / "k8s" / "rayservice.yaml").read_text())
    cluster = manifest["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
            assert env.items() >= farm_env("haproxy").items(), container["name"]
    for script in ("start_head.sh", "start_worker.sh"):
        text = (REPO / "cluster" / script).read_text()
        assert "RAY_SERVE_ENABLE_HA_PROXY" in text and "RAY_SERVE_THROUGHPUT_OPTIMIZED" in text
        for key, value in {**HAPROXY_TUNING, **RAY_TUNING}.items():
            assert f'{key}="${{{key}:-{value}}}"' in text, (script, key)
    launcher = yaml.safe_load((REPO / "cluster" / "ray-cluster.yaml").read_text())
    for cmd in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in launcher[cmd] if "ray start" in c]
        assert starts and all("RAY_SERVE_ENABLE_HA_PROXY=1" in c for c in starts)
        for key, value in farm_env("haproxy").items():
            assert all(f"{key}={shlex.quote(value)}" in c for c in starts), (cmd, key)


def test_farm_env_tunes_haproxy_only_under_haproxy(monkeypatch):
    haproxy, python = farm_env("haproxy"), farm_env("python")
    assert haproxy.items() >= {**ingress_env("haproxy"), **HAPROXY_TUNING, **RAY_TUNING}.items()
    assert not python.keys() & HAPROXY_TUNING.keys()
    assert python.items() >= RAY_TUNING.items()
    # use_ingress: the mode always wins; an operator's own tuning value is kept.
    for key in {**farm_env("haproxy"), **HAPROXY_TUNING}:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S", "7")
    monkeypatch.setenv(ENV_HAPROXY, "0")
    use_ingress("haproxy")
    assert os.environ[ENV_HAPROXY] == "1"
    assert os.environ["RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S"] == "7"
    assert os.environ["RAY_SERVE_HAPROXY_HEALTH_CHECK_DOWNINTER"] == "250ms maxconn 64"


# -- on a running farm (HAProxy ingress) ------------------------------------------------------

@pytest.fixture(scope="module")
def haproxy_farm(bundled_catalog):
    from envfarm.farm import PoolConfig, free_port
    from envfarm.serve import ServeOptions
    from tests.envfarm.serve.conftest import _start

    farm = _start(FarmConfig(envs=[FAST, DOORED], pool=PoolConfig(warm=2)),
                  ServeOptions(port=free_port(), num_cpus=2,
                               per_env={DOORED: DeploymentOptions(num_replicas=2)}))
    try:
        yield farm
    finally:
        farm.shutdown()


def _auth(info: dict) -> dict[str, str]:
    return {"Authorization": f"Bearer {info['token']}"}


def _foreign(lease_id: str) -> str:
    """The same random part under another owner tag (a replica that never existed)."""
    owner, _, rand = lease_id.rpartition("-")
    return f"{'x' if owner[0] != 'x' else 'y'}{owner[1:]}-{rand}"


@pytest.mark.ray
async def test_farm_runs_haproxy_ingress_and_refuses_the_other_mode(haproxy_farm):
    import ray

    from envfarm.serve._run import _check_cluster_ingress, _cluster_haproxy_setting

    assert haproxy_farm.proxy == "haproxy"
    assert ray.get(_cluster_haproxy_setting.remote()) == "1"
    with pytest.raises(IngressMismatch, match=ENV_HAPROXY):
        _check_cluster_ingress("python")


@pytest.mark.ray
async def test_haproxy_queues_past_64_connections_per_replica(haproxy_farm):
    """The tuning reaches HAProxy's config (maxconn, no per-request metrics log), and 160
    clients at once get at most 64 connections to the replica (the rest queue in HAProxy),
    every answer a 200, no fallback."""
    import asyncio

    text = haproxy_config(haproxy_farm.url)
    backend = text.split(f"\nbackend http-env-{FAST}\n", 1)[1].split("\nbackend ", 1)[0]
    assert "maxconn 64" in backend
    assert "log-format-sd" not in text  # no log line per request to the HAProxyManager
    limits = httpx.Limits(max_connections=160, max_keepalive_connections=160)
    async with httpx.AsyncClient(base_url=haproxy_farm.url, timeout=60, limits=limits) as c:
        infos = [(await c.post(f"/envs/{FAST}/leases", json={})).json() for _ in range(16)]

        async def calls(info: dict) -> list[int]:
            path = f"/envs/{FAST}/leases/{info['lease_id']}/call"
            return [(await c.post(path, headers=_auth(info),
                                  json={"tool": "get_my_profile"})).status_code
                    for _ in range(4)]

        codes = await asyncio.gather(*(calls(infos[i % 16]) for i in range(160)))
        for info in infos:
            await c.delete(f"/envs/{FAST}/leases/{info['lease_id']}", headers=_auth(info))
    assert {code for batch in codes for code in batch} == {200}
    stats = haproxy_servers(haproxy_farm.url)
    (replica,) = [v for k, v in stats.items() if k.startswith(f"http-env-{FAST}/SERVE_REPLICA")]
    (fallback,) = [v for k, v in stats.items() if k.startswith(f"http-env-{FAST}/SERVE_PROXY")]
    # maxconn 64 (HAProxy's own count has shown 65 under load: the check session, say); 160
    # clients without it gave 71 here, and 1,024 gave 1,024.
    assert 1 <= int(replica["smax"]) <= 65, replica["smax"]
    assert replica["status"] == "UP" and replica["chkdown"] == "0"
    assert fallback["stot"] == "0"  # nothing went through the Python-proxy fallback


@pytest.mark.ray
async def test_replicas_write_no_access_log_line_per_call(haproxy_farm):
    """Serve logs every request at INFO into a 1,000-record buffer by default: a line (and a
    formatted record) per tool call. The farm's deployments log at WARNING without the access
    log, so 1,100 calls (past one buffer flush) leave no request line in the replica's log."""
    import asyncio

    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    (log,) = logs.glob(f"replica_env-{FAST}_pool_*.log")
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=haproxy_farm.url, timeout=60, limits=limits) as c:
        info = (await c.post(f"/envs/{FAST}/leases", json={})).json()
        path = f"/envs/{FAST}/leases/{info['lease_id']}/call"

        async def calls() -> set[int]:
            return {(await c.post(path, headers=_auth(info), json={"tool": "get_my_profile"})
                     ).status_code for _ in range(110)}

        codes = set().union(*await asyncio.gather(*(calls() for _ in range(10))))
        await c.delete(f"/envs/{FAST}/leases/{info['lease_id']}", headers=_auth(info))
    assert codes == {200}
    lines = log.read_text().splitlines()
    assert not [x for x in lines if f" /envs/{FAST} " in x], lines[-3:]


@pytest.mark.ray
@pytest.mark.parametrize("env", [FAST, DOORED])
async def test_lease_calls_and_mcp_reach_the_owner_on_both_layouts(haproxy_farm, env):
    from fastmcp import Client
    from fastmcp.client.transports import StreamableHttpTransport

    async with httpx.AsyncClient(base_url=haproxy_farm.url, timeout=60) as c:
        infos = [(await c.post(f"/envs/{env}/leases", json={})).json() for _ in range(8)]
        assert all("lease_id" in i for i in infos), infos
        for info in infos:  # 2 calls each: the second must see the first one's write
            path = f"/envs/{env}/leases/{info['lease_id']}"
            tools = (await c.get(path + "/tools", headers=_auth(info))).json()
            assert tools and all("name" in t for t in tools)
            r = await c.post(path + "/reset", headers=_auth(info))
            assert r.status_code == 200, r.text
        info = infos[0]
        transport = StreamableHttpTransport(f"{haproxy_farm.url}/envs/{env}/leases/"
                                            f"{info['lease_id']}/mcp", headers=_auth(info))
        async with Client(transport) as mcp:
            assert await mcp.list_tools()
        owners = {i["lease_id"].split("-")[0] for i in infos}
        assert len(owners) == (1 if env == FAST else 2), owners
        for info in infos:
            r = await c.delete(f"/envs/{env}/leases/{info['lease_id']}", headers=_auth(info))
            assert r.json()["status"] == "closed"


@pytest.mark.ray
@pytest.mark.parametrize("env", [FAST, DOORED])
async def test_bad_leases_get_typed_4xx(haproxy_farm, env):
    async with httpx.AsyncClient(base_url=haproxy_farm.url, timeout=60) as c:
        info = (await c.post(f"/envs/{env}/leases", json={})).json()
        base = f"/envs/{env}/leases"
        call = {"tool": "get_my_profile"}
        owner = info["lease_id"].split("-")[0]
        cases = {
            f"{base}/{_foreign(info['lease_id'])}/call": 410,  # owner never existed / gone
            f"{base}/{owner}-00ff/call": 404,  # the owner's, but no such lease
            f"{base}/{_foreign(info['lease_id'])}/mcp": 410,
        }
        for path, status in cases.items():
            r = await c.post(path, headers=_auth(info), json=call)
            assert r.status_code == status, (path, r.text)
            assert r.json()["error"]["kind"] in {"gone", "not_found"}
        r = await c.post(f"{base}/{info['lease_id']}/call", json=call,
                         headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 403
        r = await c.post(f"{base}/{info['lease_id']}/call", json=call)
        assert r.status_code == 401
        await c.delete(f"{base}/{info['lease_id']}", headers=_auth(info))


def _payees(listed: httpx.Response) -> set[str]:
    assert listed.status_code == 200 and listed.json()["ok"], listed.text
    result = listed.json()["result"]
    rows = result.get("payees", result) if isinstance(result, dict) else result
    return {p["name"] for p in rows}


@pytest.mark.ray
async def test_a_request_forced_onto_a_non_owner_is_never_served_fresh(haproxy_farm):
    """Send a lease's calls to the replica that does not own it (by index, bypassing owner
    routing): it hands them on to the owner, which serves them on the lease's own state. A
    request already handed on once is answered where it lands: 410 there, state untouched."""
    from ray import serve

    from envfarm.serve._deployments import ForwardedRequest
    from envfarm.serve._handles import fresh_call
    from envfarm.serve._to_owner import FORWARDED

    pool = serve.get_deployment_handle("pool", app_name=f"env-{DOORED}")
    who = [await fresh_call(pool.whoami, owner=f"#{i}") for i in range(2)]
    index = {w["owner"]: i for i, w in enumerate(who)}
    assert len(index) == 2
    async with httpx.AsyncClient(base_url=haproxy_farm.url, timeout=60) as c:
        info = (await c.post(f"/envs/{DOORED}/leases", json={})).json()
        path = f"/envs/{DOORED}/leases/{info['lease_id']}"
        listing = {"tool": "list_payees"}
        before = _payees(await c.post(path + "/call", headers=_auth(info), json=listing))
        other = 1 - index[info["lease_id"].split("-")[0]]
        headers = [(b"authorization", f"Bearer {info['token']}".encode()),
                   (b"content-type", b"application/json")]

        async def on_other(method: str, suffix: str, body: bytes, extra=()) -> Any:
            return await fresh_call(pool.forward, ForwardedRequest(
                method=method, path=path + suffix, headers=[*headers, *extra], body=body),
                owner=f"#{other}")

        # Handed on once: a marked request on the non-owner is 410 and changes nothing.
        marked = [(FORWARDED, b"test")]
        write = json.dumps({"tool": "create_payee", "arguments": {
            "name": "forced-write", "payee_type": "business", "account_number": "12345678"}})
        for method, suffix, body in [("POST", "/call", write.encode()),
                                     ("POST", "/reset", b""), ("GET", "/tools", b""),
                                     ("DELETE", "", b"")]:
            res = await on_other(method, suffix, body, marked)
            assert res.status == 410, (method, suffix, res.body)
        assert _payees(await c.post(path + "/call", headers=_auth(info), json=listing)) == before
        # Unmarked: the non-owner hands the write on; it lands on the lease's own state.
        res = await on_other("POST", "/call", write.encode())
        assert res.status == 200 and json.loads(res.body)["ok"], res.body
        after = _payees(await c.post(path + "/call", headers=_auth(info), json=listing))
        assert after == before | {"forced-write"}
        handed = (await fresh_call(pool.whoami, owner=f"#{other}"))["handed_on"]
        assert handed >= 1
        r = await c.delete(path, headers=_auth(info))
        assert r.json()["status"] == "closed"
