"""The status page's data: the rolling window, the merge across replicas, and /status.json."""

from __future__ import annotations

import random

import pytest

from envfarm.farm import ReplicaStatus, summarize_status
from envfarm.farm._window import CallWindow, WindowStats, latency_bucket, quantile
from envfarm.wire import PoolStats
from tests.envfarm.farm.conftest import ENV, farm_client, new_lease
from tests.envfarm.farm.test_env_errors import core, faulty  # noqa: F401 - fixtures


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_window_counts_the_last_seconds_only():
    clock = FakeClock()
    window = CallWindow(seconds=10, clock=clock)
    clock.now += 20  # long after start: the span is the whole window
    for _ in range(30):
        window.record_call("a", "ok", 0.002)
    window.record_call("a", "agent_error", 0.001)
    window.record_verification("a", "invalid")
    clock.now += 5.5
    for _ in range(10):
        window.record_call("b", "ok", 0.004)
    snap = window.snapshot()
    assert snap["a"].calls == {"ok": 30, "agent_error": 1}
    assert snap["a"].verifications == {"invalid": 1}
    assert snap["b"].calls == {"ok": 10}
    assert snap["a"].span_s == pytest.approx(9.5)
    clock.now += 5  # a's second has left the window, b's has not
    snap = window.snapshot()
    assert "a" not in snap and snap["b"].calls == {"ok": 10}
    clock.now += 10
    assert window.snapshot() == {}


def test_span_is_at_least_a_second_just_after_start():
    clock = FakeClock()
    window = CallWindow(seconds=10, clock=clock)
    clock.now += 0.1
    window.record_call("a", "ok", 0.001)
    assert window.snapshot()["a"].span_s == 1.0


def test_percentiles_are_within_the_bucket_resolution():
    rng = random.Random(7)
    samples = [rng.lognormvariate(-6, 1.2) for _ in range(20_000)]
    hist: dict[int, int] = {}
    for s in samples:
        hist[latency_bucket(s)] = hist.get(latency_bucket(s), 0) + 1
    ordered = sorted(samples)
    for q in (0.5, 0.9, 0.99):
        exact = ordered[int(q * len(ordered)) - 1]
        assert quantile(hist, q) == pytest.approx(exact, rel=0.045)
    assert quantile({}, 0.5) is None


def _replica(owner: str, calls: dict[str, int], latencies: list[float], span: float,
             leased: int) -> ReplicaStatus:
    hist: dict[int, int] = {}
    for s in latencies:
        hist[latency_bucket(s)] = hist.get(latency_bucket(s), 0) + 1
    pool = PoolStats(env=ENV, free=4, leased=leased, resetting=1, warm_target=4,
                     max_instances=64)
    return ReplicaStatus(owner=owner, app="env-x", pid=1, leases=leased, pools=[pool],
                         window={ENV: WindowStats(span_s=span, calls=calls, latency=hist,
                                                  verifications={"completed": 3, "invalid": 1})})


def test_summary_adds_rates_and_merges_histograms_across_replicas():
    fast = _replica("r1", {"ok": 100}, [0.001] * 100, 10.0, leased=2)
    slow = _replica("r2", {"ok": 40, "env_error": 10}, [0.1] * 50, 5.0, leased=3)
    status = summarize_status([slow, fast], [ENV, "idle_env"], "serve", unreachable=1)
    row = {e.env: e for e in status.envs}[ENV]
    assert row.replicas == 2 and row.leased == 5 and row.warm == 8 and row.resetting == 2
    assert row.calls_per_s == pytest.approx(100 / 10 + 50 / 5)
    assert row.calls == 150 and row.verifications == 8
    assert row.errors.env_error == pytest.approx(10 / 150) and row.errors.agent_error == 0
    assert row.errors.invalid_verify == pytest.approx(2 / 8)
    assert row.p50_ms == pytest.approx(1.0, rel=0.03)  # 100 of 150 calls took 1 ms
    assert row.p99_ms == pytest.approx(100.0, rel=0.03)
    idle = {e.env: e for e in status.envs}["idle_env"]
    assert idle.replicas == 0 and idle.calls_per_s == 0 and idle.p50_ms is None
    assert idle.errors.agent_error is None
    assert [r.owner for r in status.replicas] == ["r1", "r2"] and status.unreachable == 1
    assert status.leases == 5 and status.calls_per_s == pytest.approx(20.0)


async def test_status_json_of_a_farm_counts_calls_errors_and_verifications(core):  # noqa: F811
    async with farm_client(core) as client:
        root = await client.get("/")
        assert root.status_code == 307 and root.headers["location"] == "status"
        page = await client.get("/status")
        assert page.status_code == 200 and "status.json" in page.text
        before = (await client.get("/status.json")).json()
        assert [e["env"] for e in before["envs"]] == [ENV]
        assert before["envs"][0]["calls"] == 0 and before["envs"][0]["p50_ms"] is None

        path, auth, _ = await new_lease(client, task_idx=0)
        for tool in ["list_wishlists"] * 6 + ["no_such_tool", "boom_now"]:
            r = await client.post(path + "/call", headers=auth, json={"tool": tool})
            assert r.status_code == 200, r.text
        verdict = (await client.post(path + "/verify", headers=auth)).json()
        assert verdict["outcome"] == "environment_error"
        status = (await client.get("/status.json")).json()

    (env,) = status["envs"]
    assert env["calls"] == 8 and env["calls_per_s"] > 0 and env["leased"] == 1
    assert env["errors"] == {"agent_error": 1 / 8, "env_error": 1 / 8, "invalid_verify": 1.0}
    assert 0 < env["p50_ms"] <= env["p99_ms"]
    assert status["mode"] == "no-ray" and status["leases"] == 1
    assert [r["owner"] for r in status["replicas"]] == [core.owner]
