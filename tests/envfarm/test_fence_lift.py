"""The fence's lift (``_sqlite_guard.Fence``): a call alone in the process runs its SQL steps
unfenced, and nothing ever changes a connection's progress handler from a thread other than
the one stepping it (that deadlocked: ``set_progress_handler`` waits for the connection's mutex
holding the GIL, while the stepping thread waits for the GIL in a callback)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from envfarm import EnvRuntime, _sqlite_guard
from tests.fakes.toy_env import CODE, toy_bundle

REPO = Path(__file__).resolve().parents[2]
THREADS, ROUNDS = 2, 150

ROUTES = '''

def _count(k):
    # The bound as a literal: a new statement each time, so SQLite prepares it (and calls the
    # authorizer, which needs the GIL) inside the connection's mutex.
    sql = f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {int(k)}) "
    session = SessionLocal()
    try:
        return session.execute(text(sql + "SELECT count(*) FROM n")).scalar()
    finally:
        session.close()


@app.get("/f/scan_async", operation_id="scan_async")
async def scan_async(k: int = 2000):
    return {"n": _count(k)}


@app.get("/f/scan_sync", operation_id="scan_sync")
def scan_sync(k: int = 2000):
    return {"n": _count(k)}


def _dep_count():
    yield _count(50)


@app.get("/f/scan_dep", operation_id="scan_dep")
async def scan_dep(k: int = 2000, pre: int = Depends(_dep_count)):
    return {"n": _count(k) + pre}
'''


def _runtime() -> EnvRuntime:
    head, main = CODE.split('\nif __name__ == "__main__":')
    code = head.replace("from fastapi import ", "from fastapi import Depends, ", 1)
    code += "\nfrom sqlalchemy import text\n"
    return EnvRuntime(toy_bundle(code + ROUTES + '\nif __name__ == "__main__":' + main),
                      call_timeout_s=10.0)


@pytest.fixture(scope="module")
def runtime() -> EnvRuntime:
    return _runtime()


def _lifts() -> int:
    return _sqlite_guard._calls.lifts


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    """An earlier test's timed-out call turned lifting off for this process for good."""
    monkeypatch.setattr(_sqlite_guard._calls, "stale", False)


def test_a_call_alone_in_the_process_runs_unfenced_and_the_fence_is_back_after(runtime):
    inst = runtime.instance()
    before = _lifts()
    assert inst.call_sync("scan_async", {"k": 3000}).result == {"n": 3000}
    assert _lifts() > before, "the only call in flight was never lifted"
    assert _sqlite_guard._calls.lifted is None and not _sqlite_guard._calls.lift_lock.locked()


def test_once_a_call_timed_out_nothing_is_lifted_again(runtime):
    inst = runtime.instance()
    slow = EnvRuntime(runtime.bundle, call_timeout_s=0.2).instance()
    res = slow.call_sync("scan_sync", {"k": 5_000_000})
    assert not res.ok and "timed out" in res.error.message, res
    before = _lifts()
    assert inst.call_sync("scan_async", {"k": 3000}).ok
    assert _lifts() == before, "lifted after a call's code may have outlived it"


async def test_two_calls_in_flight_run_fenced(runtime):
    a, b = runtime.instance(), runtime.instance()
    await a.call("scan_async", {"k": 10})  # warm
    results = await asyncio.gather(*(x.call("scan_sync", {"k": 20_000}) for x in (a, b)))
    assert [r.result for r in results] == [{"n": 20_000}] * 2
    # While a sync handler holds a call open on a thread, the other call's steps stay fenced.
    slow = asyncio.ensure_future(a.call("scan_sync", {"k": 200_000}))
    await asyncio.sleep(0.05)
    assert not slow.done()
    before = _lifts()
    for _ in range(5):
        assert (await b.call("scan_async", {"k": 100})).ok
    assert _lifts() == before, "a call was lifted while another was in flight"
    assert not slow.done(), "the sync call ended before the other calls: make it longer"
    assert (await slow).result == {"n": 200_000}


def _stress(tool: str) -> None:
    """Four threads, each with its own event loop and lease; calls hand SQL to anyio's pool
    (a sync handler, a sync dependency) while others start and end around them."""
    runtime = _runtime()
    done: list[int] = []
    errors: list[object] = []

    def client(seed: int) -> None:
        inst = runtime.instance()

        async def run() -> None:
            for i in range(ROUNDS):
                name = tool if (i + seed) % 2 else "scan_async"
                res = await inst.call(name, {"k": 200 + 2 * i + seed})
                if not res.ok:
                    errors.append(res.error)
            done.append(seed)

        asyncio.run(run())

    threads = [threading.Thread(target=client, args=(s,), daemon=True) for s in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(done) == list(range(THREADS)), f"hung: {[t.name for t in threads if t.is_alive()]}"
    assert errors == [], errors
    assert _sqlite_guard._calls.lifted is None and not _sqlite_guard._calls.lift_lock.locked()
    print("ok", _sqlite_guard._calls.lifts)


@pytest.mark.parametrize("tool", ["scan_sync", "scan_dep"])
def test_calls_from_many_threads_with_sql_on_pool_threads_never_deadlock(tool):
    """In a child process: a deadlock holds the GIL, so it would hang this one. The lift as
    first written (a starting call closed another thread's fence) hung here within seconds."""
    code = f"from tests.envfarm.test_fence_lift import _stress; _stress({tool!r})"
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                              text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlocked: the calls did not finish in 60 s")
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]
    assert int(proc.stdout.split()[1]) > 0  # calls alone in the process were lifted
