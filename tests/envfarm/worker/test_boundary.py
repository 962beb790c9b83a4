"""The trust boundary, attacked through the farm's HTTP and MCP API (issue 20).

A real ``--no-ray`` farm on loopback serves a hostile env and a plain one ("victim")
from jailed worker processes. Each test calls a hostile tool the way an agent would and checks
the outcome from outside: the front alive and answering, no file, no secret, other leases'
state and tokens untouched, a typed error, no hang.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from tests.envfarm.worker.conftest import SECRET, start_farm
from tests.envfarm.worker.hostile_env import HOSTILE, with_code

pytestmark = pytest.mark.slow


class Leases:
    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30)

    def lease(self, env: str) -> tuple[str, dict[str, str], dict]:
        r = self.http.post(f"/envs/{env}/leases", json={})
        assert r.status_code == 201, r.text
        info = r.json()
        return (f"/envs/{env}/leases/{info['lease_id']}",
                {"Authorization": f"Bearer {info['token']}"}, info)

    def call(self, lease_path: str, auth: dict, tool: str, /, **arguments) -> httpx.Response:
        return self.http.post(lease_path + "/call", headers=auth,
                              json={"tool": tool, "arguments": arguments})


@pytest.fixture(scope="module")
def api(hostile_farm) -> Leases:
    leases = Leases(hostile_farm.url)
    yield leases
    leases.http.close()


@pytest.fixture
def victim(api) -> tuple[str, dict]:
    """A lease of another env with state of its own, checked after each attack."""
    path, auth, _ = api.lease("victim")
    assert api.call(path, auth, "create_note", title="victim-state").json()["ok"]
    return path, auth


def _victim_intact(api, victim) -> None:
    path, auth = victim
    r = api.call(path, auth, "list_notes")
    assert r.status_code == 200, r.text
    assert "victim-state" in [n["title"] for n in r.json()["result"]]


def _result(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ok"], body
    return body["result"]


def _refused(r: httpx.Response, key: str | None = None) -> None:
    """The attempt failed: the tool reported it could not, or an in-worker hook refused it
    (an env_error), whichever layer stopped it first."""
    assert r.status_code == 200, r.text
    body = r.json()
    if not body["ok"]:
        assert body["error"]["kind"] == "env_error", body
        return
    seen = body["result"] if key is None else body["result"][key]
    assert not seen["done"], seen


def test_workers_are_jailed_and_the_front_runs_no_env_code(hostile_farm):
    core = hostile_farm.core
    assert core.isolation.startswith("workers, confined")
    assert all(served.isolation == "workers" for served in core.envs.values())
    import sys

    assert not {"_envfarm_env_hostile", "_envfarm_env_victim"} & set(sys.modules), \
        "env code was loaded in the front"


def test_environment_of_the_front_is_out_of_reach(api, victim):
    path, auth, _ = api.lease("hostile")
    seen = _result(api.call(path, auth, "steal_environ", ppid=os.getpid()))
    assert SECRET not in str(seen)
    assert not seen["proc_" + str(os.getpid())]["done"]
    _victim_intact(api, victim)


@pytest.mark.parametrize("target", ["/etc/passwd", "/root", "{project}/pyproject.toml"])
def test_files_outside_the_python_installation_are_unreadable(api, target):
    path, auth, _ = api.lease("hostile")
    target = target.format(project=Path(__file__).resolve().parents[3])
    assert not _result(api.call(path, auth, "read_path", path=target))["done"]


def test_no_file_is_written_by_any_door(api, tmp_path):
    path, auth, _ = api.lease("hostile")
    for tool, name in (("write_path", "direct"), ("sql_to_file", "attach"),
                       ("run_command", "exec")):
        api.call(path, auth, tool, path=str(tmp_path / name))
    assert list(tmp_path.iterdir()) == []


def test_no_process_is_started(api, tmp_path):
    path, auth, _ = api.lease("hostile")
    seen = _result(api.call(path, auth, "run_command", path=str(tmp_path / "x")))
    assert not any(seen[k]["done"] and seen[k]["value"] == 0 for k in ("system", "fork"))
    assert not seen["spawn"]["done"]


def test_no_socket_reaches_the_front(api, hostile_farm):
    path, auth, _ = api.lease("hostile")
    seen = _result(api.call(path, auth, "connect_to", port=hostile_farm.port))
    assert not seen["done"], seen


def test_the_front_cannot_be_signalled_or_traced(api, victim):
    path, auth, _ = api.lease("hostile")
    seen = _result(api.call(path, auth, "signal_parent", ppid=os.getpid()))
    assert not seen["kill"]["done"] and not seen["killpg"]["done"]
    r = api.call(path, auth, "ptrace_parent", ppid=os.getpid())
    if r.json()["ok"]:
        seen = r.json()["result"]
        assert not (seen["ptrace"]["done"] and seen["ptrace"]["value"]["rc"] == 0)
        assert not seen["mem"]["done"]
    else:
        _refused(r)
    _victim_intact(api, victim)


def test_a_worker_holds_no_descriptor_of_the_front(api):
    """Its descriptors are its own: the channel's pipes, its event loop's. None is a socket or
    file of the front's (listening socket, client connections)."""
    path, auth, _ = api.lease("hostile")
    seen = api.call(path, auth, "scan_fds").json()
    fds = seen["result"]["value"] if seen["ok"] and seen["result"]["done"] else {}
    front = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            front.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    # Pipes and sockets carry their inode in the name; anon inodes (epoll) all read the same.
    shared = {t for t in fds.values() if t in front and not t.startswith(("pipe:", "anon_"))}
    assert not shared, shared


def test_no_token_or_request_of_another_lease_is_in_the_worker(api):
    others = [api.lease("hostile") for _ in range(3)]
    path, auth, _ = api.lease("hostile")
    hunt = _result(api.call(path, auth, "hunt_tokens"))
    found = hunt["found"]
    assert hunt["walked"] > 5_000  # it did look
    tokens = [info["token"] for _, _, info in others]
    assert not [t for t in tokens if any(t in f for f in found)]
    assert not [f for f in found if "Bearer " in f]


def _lost(r: httpx.Response) -> None:
    assert r.status_code == 410, r.text
    error = r.json()["error"]
    assert error["kind"] == "gone" and error.get("reason") == "lease_lost", error


@pytest.mark.parametrize("tool", ["hard_exit", "segfault"])
def test_a_worker_that_dies_loses_only_the_lease_whose_call_killed_it(api, victim, tool):
    """Issue 34 §5: the neighbour on the same worker continues on a fresh one, its state and
    verification intact; only the lease whose call killed the worker is lost."""
    path, auth, _ = api.lease("hostile")
    neighbour = api.lease("hostile")  # same worker (4 leases each)
    assert api.call(neighbour[0], neighbour[1], "create_note", title="kept").json()["ok"]
    _lost(api.call(path, auth, tool))
    _lost(api.call(path, auth, "list_notes"))
    r = api.call(neighbour[0], neighbour[1], "list_notes")
    assert r.status_code == 200 and "kept" in [n["title"] for n in r.json()["result"]], r.text
    r = api.http.post(neighbour[0] + "/verify", headers=neighbour[1], json={"task_idx": 0})
    assert r.status_code == 200, r.text
    _victim_intact(api, victim)
    fresh, fresh_auth, _ = api.lease("hostile")  # a new worker takes its place
    assert api.call(fresh, fresh_auth, "list_notes").json()["ok"]


def test_a_call_past_its_deadline_kills_its_worker_not_the_front(api, victim):
    path, auth, _ = api.lease("hostile")
    started = time.monotonic()
    _lost(api.call(path, auth, "burn_in_c"))  # stuck in C: the in-worker watchdog cannot stop it
    # twice (call timeout + grace): once among others, once alone (docs/tenancy.md), + slack
    assert time.monotonic() - started < 2 * (2.0 + 2.0) + 4.0
    _victim_intact(api, victim)
    assert api.http.get("/healthz").status_code == 200


def test_code_that_swallows_its_timeout_is_answered_and_its_worker_drained(secret_env):
    """`while True: try: ... except: continue` keeps a thread spinning after its call timed
    out: the call is answered (typed), and the worker takes no new lease and stops once its
    leases are gone."""
    farm = start_farm({"hostile": with_code(HOSTILE)}, call_timeout_s=1.0,
                      leases_per_worker=2, check_module_state=False)
    try:
        api = Leases(farm.url)
        path, auth, _ = api.lease("hostile")
        r = api.call(path, auth, "swallow_timeout")
        if r.status_code == 410:
            _lost(r)  # it also missed the front's deadline: the worker was killed
            return
        assert not r.json()["ok"] and "timed out" in r.json()["error"]["message"], r.text
        served = farm.core.envs["hostile"]
        spinning = next(w for w in served.workers if w.draining)
        fresh, fresh_auth, _ = api.lease("hostile")  # room for 2, but not on that worker
        assert spinning.leases == 1
        assert api.call(fresh, fresh_auth, "list_notes").json()["ok"]
        api.http.delete(path, headers=auth)
        assert spinning.lost is not None  # its last lease gone: stopped
    finally:
        api.http.close()
        farm.stop()


def test_a_worker_that_stops_itself_is_killed_at_the_deadline(api, victim):
    path, auth, _ = api.lease("hostile")
    _lost(api.call(path, auth, "stop_itself"))
    _victim_intact(api, victim)


def test_an_oversized_answer_is_a_typed_error(api):
    path, auth, _ = api.lease("hostile")
    r = api.call(path, auth, "huge_answer")
    assert r.status_code == 200 and r.json()["error"]["kind"] == "env_error"
    assert "limit" in r.json()["error"]["message"]
    assert api.call(path, auth, "list_notes").json()["ok"]


def test_a_memory_blow_up_is_a_typed_error(api, victim):
    path, auth, _ = api.lease("hostile")
    r = api.call(path, auth, "eat_memory")
    if r.status_code == 410:
        _lost(r)  # the kernel ended the worker: its leases are lost, typed
    else:
        assert not _result(r)["done"]
    _victim_intact(api, victim)


def test_process_settings_stay_in_the_worker(api, victim):
    import sys

    before = sys.getswitchinterval()
    path, auth, _ = api.lease("hostile")
    api.call(path, auth, "change_process")
    assert sys.getswitchinterval() == before and os.nice(0) == os.nice(0)
    _victim_intact(api, victim)


def test_mcp_surface_is_confined_too(api, hostile_farm):
    path, auth, info = api.lease("hostile")
    headers = {**auth, "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "steal_environ", "arguments": {"ppid": os.getpid()}}}
    r = api.http.post(path + "/mcp", headers=headers, json=body)
    assert r.status_code == 200 and SECRET not in r.text
    body["params"] = {"name": "hard_exit", "arguments": {}}
    r = api.http.post(path + "/mcp", headers=headers, json=body)
    assert r.status_code == 410 and "lease_lost" in r.text
