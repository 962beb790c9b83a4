"""Placing leases on workers: concurrency, capacity, growth, release (issue 20 §3)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from envfarm.worker import WorkerEnv, WorkerOptions
from tests.envfarm.worker.conftest import catalog
from tests.envfarm.worker.hostile_env import with_code

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle():
    return catalog(plain=with_code(""))["plain"]


async def test_concurrent_leases_never_overbook_a_worker(bundle):
    env = WorkerEnv(bundle, WorkerOptions(leases_per_worker=4, probe_module_state=False,
                                          retire_idle_s=0), warm=2)
    try:
        insts = await asyncio.gather(*(env.acquire() for _ in range(10)))
        assert len({(i.worker.pid, i.inst) for i in insts}) == 10
        per_worker: dict[int, int] = {}
        for inst in insts:
            per_worker[inst.worker.pid] = per_worker.get(inst.worker.pid, 0) + 1
        assert max(per_worker.values()) <= 4 and len(per_worker) >= 3
        results = await asyncio.gather(*(i.call("create_note", {"title": f"n{k}"})
                                         for k, i in enumerate(insts)))
        assert all(r.ok for r in results)
        titles = await asyncio.gather(*(i.call("list_notes", {}) for i in insts))
        for k, res in enumerate(titles):  # each instance saw only its own write
            assert [n["title"] for n in res.result][-1] == f"n{k}"
            assert len(res.result) == 3
        for inst in insts:
            env.release(inst)
        assert env.leased() == 0
        assert len(env.workers) <= 2  # idle workers stopped, but warm capacity kept
        assert env.free_slots() >= 2
    finally:
        await env.aclose()


async def test_a_burst_of_leases_starts_workers_at_once_not_one_by_one(bundle):
    """A fresh replica handed many leases at once (its predecessor died) starts as many workers
    together as the waiting leases fill, up to MAX_STARTS_AT_ONCE; none overbooked."""
    from envfarm.worker._env import MAX_STARTS_AT_ONCE

    env = WorkerEnv(bundle, WorkerOptions(leases_per_worker=2, probe_module_state=False,
                                          retire_idle_s=0), warm=0)
    starting: list[int] = []

    async def watch() -> None:
        while True:
            starting.append(env.starting)
            await asyncio.sleep(0.005)

    watcher = asyncio.ensure_future(watch())
    try:
        insts = await asyncio.gather(*(env.acquire() for _ in range(12)))
        watcher.cancel()
        per_worker: dict[int, int] = {}
        for inst in insts:
            per_worker[inst.worker.pid] = per_worker.get(inst.worker.pid, 0) + 1
        assert max(per_worker.values()) <= 2 and len(per_worker) == 6
        assert max(starting) == MAX_STARTS_AT_ONCE, max(starting)  # 10 waiting: 5 wanted
        assert env.starting == 0
        for inst in insts:
            env.release(inst)
    finally:
        watcher.cancel()
        await env.aclose()


async def test_leases_of_a_killed_worker_continue_on_a_new_one_with_their_state(bundle):
    """Issue 34 §5: a worker killed with no call in flight loses no lease: each continues on a
    fresh worker from its last completed call."""
    env = WorkerEnv(bundle, WorkerOptions(leases_per_worker=2, probe_module_state=False), warm=1)
    try:
        a = await env.acquire()
        b = await env.acquire()
        assert a.worker is b.worker
        for name, inst in (("a", a), ("b", b)):
            assert (await inst.call("create_note", {"title": f"note-{name}"})).ok
        dead = a.worker
        dead.kill("test: killed from outside")
        for name, inst in (("a", a), ("b", b)):
            res = await inst.call("list_notes", {})
            assert res.ok and inst.lost is None
            assert [n["title"] for n in res.result][-1] == f"note-{name}"
            assert len(res.result) == 3 and inst.worker is not dead
        c = await env.acquire()
        assert c.worker is not dead and (await c.call("list_notes", {})).ok
    finally:
        await env.aclose()


async def test_an_answer_to_a_cancelled_call_is_not_taken_for_a_forgery(bundle):
    """A client that hangs up mid-call (Serve then cancels the request) must not cost the
    worker: its answer arrives later, for an id the front no longer waits on."""
    env = WorkerEnv(bundle, WorkerOptions(probe_module_state=False), warm=1)
    try:
        inst = await env.acquire()
        for _ in range(5):
            task = asyncio.ensure_future(inst.call("list_notes", {}))
            await asyncio.sleep(0)  # sent, not answered
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        res = await inst.call("list_notes", {})
        assert res.ok and inst.lost is None
    finally:
        await env.aclose()


async def test_an_answer_to_a_request_never_sent_kills_the_worker(bundle):
    from envfarm.confined import frames

    env = WorkerEnv(bundle, WorkerOptions(probe_module_state=False), warm=1)
    try:
        inst = await env.acquire()
        worker = inst.worker
        worker.received(frames.encode({"id": 10_000, "ok": True}))  # as if it forged one
        assert worker.lost and "never sent" in worker.lost
        assert (await inst.call("list_notes", {})).ok  # no call was in flight: it moved on
        assert inst.worker is not worker
        assert frames.MAX_FRAME >= 1 << 20
    finally:
        await env.aclose()


async def test_frames_coalesced_in_one_loop_iteration_reach_their_own_callers(bundle):
    """Calls issued in one event-loop iteration leave in one pipe write (and their answers
    come back batched): each answer must still reach its own caller, in lease order."""
    env = WorkerEnv(bundle, WorkerOptions(leases_per_worker=32, probe_module_state=False), warm=1)
    try:
        insts = [await env.acquire() for _ in range(32)]
        assert len({i.worker.pid for i in insts}) == 1
        for step in range(3):
            writes = await asyncio.gather(*(i.call("create_note", {"title": f"l{k}s{step}"})
                                            for k, i in enumerate(insts)))
            assert all(r.ok for r in writes)
            reads = await asyncio.gather(*(i.call("list_notes", {}) for i in insts))
            for k, res in enumerate(reads):
                assert [n["title"] for n in res.result][2:] == [f"l{k}s{s}"
                                                                for s in range(step + 1)]
    finally:
        await env.aclose()


async def test_idle_workers_stop_after_retire_idle_s_not_at_each_release(bundle):
    """Leases that come back in steps (a GRPO step leases a batch and returns it) around the
    warm threshold restarted a worker on each step when idle ones stopped at once; they now
    stop only after ``retire_idle_s`` without a lease, and warm capacity is kept."""
    env = WorkerEnv(bundle, WorkerOptions(leases_per_worker=4, probe_module_state=False,
                                          retire_idle_s=1.0), warm=2)
    try:
        for _ in range(4):  # four steps of 9 leases, all given back after each
            insts = await asyncio.gather(*(env.acquire() for _ in range(9)))
            for inst in insts:
                env.release(inst)
        assert env.started == len(env._live()) >= 3  # no worker stopped and started again
        await asyncio.sleep(1.6)  # past retire_idle_s: the timer stops the spare ones
        assert len(env._live()) == 1 and env.free_slots() >= 2
        assert env.started == 3 or env.started == 4
    finally:
        await env.aclose()


def test_killing_an_attached_worker_closes_its_pipes_once_under_uvloop(bundle):
    """uvloop closes a pipe's fd a loop iteration after ``transport.close()``; had the front
    closed it too, the fd number, taken meanwhile by a client's socket (as accept() takes the
    lowest free one), would be closed under that socket: the clients' ReadErrors while types
    were evicted under traffic."""
    import os
    import socket

    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        env = WorkerEnv(bundle, WorkerOptions(probe_module_state=False), warm=1)
        sockets: list[socket.socket] = []
        try:
            inst = await env.acquire()  # attaches the worker's channel to this loop
            worker = inst.worker
            worker.kill("test: evicted")
            sockets = [socket.socket() for _ in range(4)]  # the lowest free fds, as accept()
            await asyncio.sleep(0.1)  # uvloop closes the pipes now
            for sock in sockets:
                os.fstat(sock.fileno())  # EBADF if a pipe's late close hit it
            assert worker.proc.stdin.closed and worker.proc.stdout.closed  # and no leak
        finally:
            for sock in sockets:
                sock.close()
            await env.aclose()

    uvloop.run(scenario())


_CYCLES = """
import asyncio, sys, uvloop
from envfarm.worker._process import WorkerProcess

async def cycles():
    for _ in range(5):
        worker = WorkerProcess({"jail": False, "memory_mb": 512})
        await worker.attach()
        worker.post({"op": "noop"})
        await asyncio.sleep(0)
        worker.kill("test")
        for _ in range(3):
            await asyncio.sleep(0)

uvloop.run(cycles())
"""


def test_a_killed_workers_pipes_are_closed_once(tmp_path):
    """uvloop's pipe transports closed a pipe's fd (libuv) and then the pipe object, the same
    number twice; a descriptor another thread opened in between (a verifier's reply pipe) was
    closed under it: verifies read EBADF under load. The channel's fds are now the front's
    alone. strace sees every close: none may fail (the old code: 2 per killed worker)."""
    import shutil
    import subprocess
    import sys

    pytest.importorskip("uvloop")
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (CI installs it): it is what sees a second close")
    trace = tmp_path / "trace"
    run = subprocess.run(["strace", "-f", "-e", "trace=close", "-o", str(trace), sys.executable,
                          "-c", _CYCLES], cwd=str(Path(__file__).resolve().parents[3]),
                         capture_output=True, text=True, timeout=120)
    if run.returncode != 0 and "ptrace" in run.stderr:
        pytest.skip(f"strace cannot trace here: {run.stderr.strip()[:200]}")
    assert run.returncode == 0, run.stderr[-2000:]
    closes = trace.read_text().splitlines()
    assert sum("close(" in line for line in closes) > 20  # it did see the closes
    assert [line for line in closes if "EBADF" in line] == []


async def test_leases_state_past_the_workers_byte_budget_loses_the_lease_that_crossed_it(bundle):
    """Issue 34 §4: the front keeps what the worker's leases wrote, within a per-worker budget;
    the call whose pages cross it loses its lease (typed), the others carry on elsewhere."""
    from tests.envfarm.worker.conftest import catalog
    from tests.envfarm.worker.tenancy_env import CODE
    from envfarm.worker import WorkerLost

    env = WorkerEnv(catalog(t=CODE)["t"], WorkerOptions(
        probe_module_state=False, kept_bytes_per_worker=1 << 20), warm=1)
    try:
        greedy, other = await env.acquire(), await env.acquire()
        assert (await other.call("bloat", {"kib": 256})).ok  # within the budget
        with pytest.raises(WorkerLost, match="byte budget"):
            await greedy.call("bloat", {"kib": 2048})
        assert greedy.lost and other.lost is None
        res = await other.call("list_notes", {})
        assert res.ok and len(res.result[-1]["title"]) == 256 << 10  # its state, moved
    finally:
        await env.aclose()
