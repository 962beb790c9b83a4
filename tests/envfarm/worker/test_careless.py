"""Careless env code, the kind an LLM writes every day, served from shared workers (issue 20 §4).

Leases of one env share a worker and its loaded module. What must not leak between them: a
module-level session's connection, connection PRAGMAs, module-level dicts (those envs are
detected at load and get a worker per lease).
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.envfarm.worker.conftest import start_farm
from tests.envfarm.worker.hostile_env import CARELESS, MODULE_STATE, with_code

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def farm():
    farm = start_farm({"careless": with_code(CARELESS), "stateful": with_code(MODULE_STATE)},
                      leases_per_worker=8)
    yield farm
    farm.stop()


@pytest.fixture(scope="module")
def http(farm):
    with httpx.Client(base_url=farm.url, timeout=30) as client:
        yield client


def lease(http, env: str):
    info = http.post(f"/envs/{env}/leases", json={}).json()
    path, auth = f"/envs/{env}/leases/{info['lease_id']}", {
        "Authorization": f"Bearer {info['token']}"}

    def call(tool: str, **arguments) -> dict:
        r = http.post(path + "/call", headers=auth, json={"tool": tool, "arguments": arguments})
        assert r.status_code == 200, r.text
        return r.json()

    call.path, call.auth = path, auth
    return call


def test_a_module_level_session_serves_each_lease_its_own_database(http, farm):
    a, b = lease(http, "careless"), lease(http, "careless")
    served = farm.core.envs["careless"]
    assert not served.per_lease and len(served.workers) == 1  # both leases: one worker
    assert "only-in-a" in a("note_via_module_session", title="only-in-a")["result"]["titles"]
    titles_b = b("titles_via_module_session")["result"]["titles"]
    assert "only-in-a" not in titles_b and titles_b == ["groceries", "todo"]
    b("note_via_module_session", title="only-in-b")
    titles_a = a("titles_via_module_session")["result"]["titles"]
    assert "only-in-a" in titles_a and "only-in-b" not in titles_a


def test_pragmas_do_not_survive_reset_or_release(http):
    a = lease(http, "careless")
    assert a("set_pragma", name="query_only", value="ON")["ok"]
    refused = a("create_note", title="read only now")
    assert not refused["ok"]  # the pragma holds within the episode
    assert http.post(a.path + "/reset", headers=a.auth).status_code == 200
    assert a("create_note", title="after reset")["ok"]
    a("set_pragma", name="query_only", value="ON")
    http.delete(a.path, headers=a.auth)
    for _ in range(3):  # whichever instance the worker gives next
        assert lease(http, "careless")("create_note", title="next lease")["ok"]


def test_a_worker_that_writes_much_to_stderr_keeps_answering(http, farm):
    """A worker's stderr comes to the front (it keeps the tail: a worker that dies at start
    says why): the front drains it, so a chatty env never stalls on a full pipe."""
    a = lease(http, "careless")
    for _ in range(3):  # 3 MiB in all: a pipe holds 64 KiB
        assert a("chatter", kib=1024)["result"] == {"wrote_kib": 1024}
    assert a("create_note", title="still here")["ok"]
    workers = list(farm.core.envs["careless"].workers)
    for _ in range(50):  # the reply and the last of the output come on different pipes
        if any(w.stderr_tail().endswith("x" * 1023) for w in workers):
            break
        time.sleep(0.05)
    assert any(w.stderr_tail().endswith("x" * 1023) for w in workers)
    assert all(len(w.stderr_tail()) <= 2000 for w in workers)


def test_module_state_is_detected_at_load_and_isolated_per_lease(http, farm):
    served = farm.core.envs["stateful"]
    assert served.per_lease and served.module_state == ["_CACHE"]
    assert any("module-level state" in p for p in served.problems)
    a, b = lease(http, "stateful"), lease(http, "stateful")
    assert a("remember", key="secret", value="from-a")["ok"]
    assert b("recall")["result"] == {"cache": {}}
    assert a("recall")["result"] == {"cache": {"secret": "from-a"}}
    http.delete(a.path, headers=a.auth)
    assert lease(http, "stateful")("recall")["result"] == {"cache": {}}


def test_the_bundled_envs_keep_no_module_state(bundled_catalog):
    import asyncio

    from envfarm.confined.probing import module_state_leaks
    from envfarm.confined.runtime import EnvRuntime

    for name in bundled_catalog.servable:
        assert asyncio.run(module_state_leaks(EnvRuntime(bundled_catalog[name]))) == [], name


def test_envs_check_reports_module_state():
    import asyncio

    from envfarm.check import check_env
    from tests.envfarm.worker.conftest import catalog

    bundles = catalog(stateful=with_code(MODULE_STATE), careless=with_code(CARELESS))
    stateful = asyncio.run(check_env(bundles["stateful"], sandbox=None, probe=True))
    careless = asyncio.run(check_env(bundles["careless"], sandbox=None, probe=True))
    assert stateful.module_state == ["_CACHE"] and careless.module_state == []
