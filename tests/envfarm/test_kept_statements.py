"""Raw SQLite handles env code keeps from one lease's call, used from another lease's (issue 24).

Leases that share a loaded module share its globals, so env code can keep a cursor or the raw
connection of the lease that was calling and try it later. SQLite checks its authorizer only
when a statement is prepared; a statement cached by Python's sqlite3 (or a cursor left in the
middle of its rows) runs again without one. Each test keeps a handle in lease A's call, then
uses it from lease B's call, between calls, or while A's call waits, and checks that A's rows
never come back and A's database is unchanged.
"""

from __future__ import annotations

import asyncio

import pytest

from envfarm import EnvRuntime

from tests.fakes.toy_env import CODE, toy_bundle

KEEPER = '''
import contextvars
_KEPT = {}


def _raw():
    return SessionLocal().connection().connection.cursor().connection


@app.post("/k/keep", operation_id="keep")
async def keep(sql: str = "SELECT title FROM notes ORDER BY id", fetch: int = -1):
    conn = _raw()
    cur = conn.cursor()
    cur.execute(sql)  # prepared (and cached) in this lease's call
    rows = cur.fetchmany(fetch) if fetch >= 0 else cur.fetchall()
    _KEPT.update(conn=conn, cur=cur)
    return {"rows": [list(r) for r in rows]}


def _use(how: str, sql: str):
    conn, cur = _KEPT["conn"], _KEPT["cur"]
    if how == "cursor":
        return cur.execute(sql).fetchall()
    if how == "rest":
        return cur.fetchall()
    if how == "conn":
        return conn.execute(sql).fetchall()
    if how == "empty_context":
        return contextvars.Context().run(lambda: conn.execute(sql).fetchall())
    if how == "write":
        conn.execute(sql)
        conn.commit()
        return []
    raise ValueError(how)


@app.post("/k/use", operation_id="use_kept")
async def use_kept(how: str, sql: str = "SELECT title FROM notes ORDER BY id"):
    try:
        return {"rows": [list(r) for r in _use(how, sql)]}
    except Exception as exc:
        return {"refused": f"{type(exc).__name__}: {exc}"}


@app.post("/k/later", operation_id="use_kept_later")
async def use_kept_later(how: str, sql: str, delay: float = 0.05):
    """Hands the kept handle to a loop callback in an empty context (host code, as seen
    by the guard), which runs after this call ended."""
    def later():
        try:
            _KEPT["later"] = [list(r) for r in _use(how, sql)]
        except Exception as exc:
            _KEPT["later"] = f"{type(exc).__name__}: {exc}"
    asyncio.get_running_loop().call_later(delay, later, context=contextvars.Context())
    return {"scheduled": True}


@app.get("/k/later_result", operation_id="later_result")
async def later_result():
    return {"later": _KEPT.get("later")}


@app.post("/k/keep_and_wait", operation_id="keep_and_wait")
async def keep_and_wait(seconds: float = 0.3):
    """Keeps this lease's handle, then waits inside its call (another lease's call runs)."""
    await keep()
    await asyncio.sleep(seconds)
    return {"waited": seconds}


@app.post("/k/keep_and_spin", operation_id="keep_and_spin")
def keep_and_spin(seconds: float = 0.3):
    """A sync handler (FastAPI runs it on a worker thread) that keeps its handle and stays
    busy: the event loop runs other leases' calls meanwhile."""
    import time as _time
    _KEPT.update(conn=_raw())
    until = _time.monotonic() + seconds
    while _time.monotonic() < until:
        pass
    return {"spun": seconds}
'''

SECRET = "only-in-lease-a"
SELECT = "SELECT title FROM notes ORDER BY id"


@pytest.fixture(scope="module")
def runtime() -> EnvRuntime:
    head, main = CODE.split('\nif __name__ == "__main__":')
    return EnvRuntime(toy_bundle(head + KEEPER + '\nif __name__ == "__main__":' + main),
                      call_timeout_s=5.0)


@pytest.fixture
def pair(runtime):
    a, b = runtime.instance(), runtime.instance()
    assert a.call_sync("create_note", {"title": SECRET}).ok
    return a, b


def _titles(inst) -> list[str]:
    return [n["title"] for n in inst.call_sync("list_notes", {}).result]


def _refused(res) -> str:
    assert res.ok, res.error
    assert "rows" not in res.result, f"another lease's rows came back: {res.result}"
    return res.result["refused"]


@pytest.mark.parametrize("how,fetch", [
    ("cursor", -1),         # the kept cursor re-runs its cached statement
    ("conn", -1),           # the kept connection runs the same SQL: a statement-cache hit
    ("empty_context", -1),  # ... from an empty contextvars.Context
    ("rest", 1),            # the kept cursor's remaining rows, its statement already running
])
def test_a_handle_kept_from_another_lease_reads_nothing(pair, how, fetch):
    a, b = pair
    kept = a.call_sync("keep", {"sql": SELECT, "fetch": fetch})
    assert kept.ok and kept.result["rows"][:1] == [["groceries"]], kept
    _refused(b.call_sync("use_kept", {"how": how, "sql": SELECT}))
    # The owner's own next call still runs what it cached.
    assert SECRET in [r[0] for r in a.call_sync("keep", {"sql": SELECT}).result["rows"]]


def test_a_handle_kept_from_another_lease_writes_nothing(pair):
    a, b = pair
    write = "DELETE FROM notes"
    a.call_sync("keep", {"sql": SELECT})
    with a.fence.host():  # cache the write statement on A's connection as if A had run it
        a.conn.execute(write)
        a.conn.rollback()
    _refused(b.call_sync("use_kept", {"how": "write", "sql": write}))
    assert SECRET in _titles(a)


async def test_a_kept_handle_does_nothing_between_calls(pair):
    a, b = pair
    await a.call("keep", {"sql": SELECT})
    res = await b.call("use_kept_later", {"how": "write", "sql": "DELETE FROM notes"})
    assert res.ok, res.error
    await asyncio.sleep(0.2)  # the callback ran, outside any call
    later = (await b.call("later_result", {})).result["later"]
    assert isinstance(later, str) and "interrupted" in later, later
    assert SECRET in [n["title"] for n in (await a.call("list_notes", {})).result]


async def test_a_kept_handle_does_nothing_while_its_owner_waits_in_a_call(pair):
    a, b = pair
    waiting = asyncio.ensure_future(a.call("keep_and_wait", {"seconds": 0.3}))
    await asyncio.sleep(0.1)  # A's call is in flight, suspended in its sleep
    assert not waiting.done()
    _refused(await b.call("use_kept", {"how": "conn", "sql": SELECT}))
    _refused(await b.call("use_kept", {"how": "write", "sql": "DELETE FROM notes"}))
    assert (await waiting).ok
    assert SECRET in [n["title"] for n in (await a.call("list_notes", {})).result]


async def test_a_kept_handle_does_nothing_while_its_owner_runs_in_a_thread(pair):
    a, b = pair
    spinning = asyncio.ensure_future(a.call("keep_and_spin", {"seconds": 0.4}))
    await asyncio.sleep(0.15)  # A's handler is busy on a worker thread
    assert not spinning.done()
    _refused(await b.call("use_kept", {"how": "conn", "sql": SELECT}))
    assert (await spinning).ok
