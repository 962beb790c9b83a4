"""Hostile endpoints added to an env's code try to escape the in-process guard (issue 12 §1).

Each test calls them through ``EnvRuntime`` the way an agent would and checks the host side:
no file appeared, no secret came back, the host process and the next lease are untouched.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envfarm import EnvRuntime
from envfarm.models import DBSchema, SampleData

from tests.fakes.toy_env import CODE, SAMPLE, SCHEMA, toy_bundle

HOSTILE = '''
import threading, concurrent.futures, contextvars, time
from sqlalchemy import text


def _touch(path):
    os.system(f"touch {path}")


@app.get("/x/read", operation_id="read_file")
async def read_file(path: str):
    with open(path) as fh:
        return {"data": fh.read()[:200]}


@app.get("/x/read_pathlib", operation_id="read_pathlib")
async def read_pathlib(path: str):
    import pathlib
    return {"data": pathlib.Path(path).read_text()[:200]}


@app.get("/x/read_os", operation_id="read_os")
async def read_os(path: str):
    fd = os.open(path, os.O_RDONLY)
    return {"data": os.read(fd, 200).decode()}


@app.get("/x/listdir", operation_id="listdir")
async def listdir(path: str):
    return {"names": os.listdir(path)}


@app.get("/x/env", operation_id="read_env")
async def read_env(name: str):
    seen = {"get": os.environ.get(name), "getenv": os.getenv(name), "len": len(os.environ),
            "in": name in os.environ, "keys": list(os.environ)[:500]}
    try:
        seen["data"] = str(os.environ._data)
    except Exception as exc:
        seen["data_error"] = type(exc).__name__
    try:
        import posix
        seen["posix"] = str(dict(posix.environ))
    except Exception as exc:
        seen["posix_error"] = type(exc).__name__
    return seen


@app.get("/x/thread", operation_id="thread_system")
async def thread_system(path: str):
    t = threading.Thread(target=_touch, args=(path,))
    t.start()
    t.join(2)
    return {"ok": True}


@app.get("/x/thread_exit", operation_id="thread_exit")
async def thread_exit():
    import sys
    threading.Thread(target=sys.exit, args=(3,)).start()
    return {"ok": True}


@app.get("/x/executor", operation_id="executor_system")
async def executor_system(path: str):
    await asyncio.get_running_loop().run_in_executor(None, _touch, path)
    return {"ok": True}


@app.get("/x/pool", operation_id="pool_system")
async def pool_system(path: str):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(_touch, path).result()
    return {"ok": True}


@app.get("/x/to_thread", operation_id="to_thread_system")
async def to_thread_system(path: str):
    await asyncio.to_thread(_touch, path)
    return {"ok": True}


@app.get("/x/fork_exec", operation_id="fork_exec")
async def fork_exec(path: str, r: int = -1, w: int = -1):
    import sys
    _posixsubprocess = sys.modules["_posixsubprocess"]
    _posixsubprocess.fork_exec(
        [b"/bin/sh", b"-c", f"touch {path}".encode()], [b"/bin/sh"], True, (w,), None, None,
        -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)
    return {"ok": True}


@app.get("/x/dunder_import", operation_id="dunder_import")
async def dunder_import(path: str):
    __import__("os").system(f"touch {path}")
    return {"ok": True}


@app.get("/x/importlib", operation_id="importlib_subprocess")
async def importlib_subprocess(path: str):
    import importlib
    importlib.import_module("subprocess").run(["touch", path])
    return {"ok": True}


@app.get("/x/empty_context", operation_id="empty_context")
async def empty_context(path: str):
    contextvars.Context().run(os.system, f"touch {path}")
    return {"ok": True}


@app.get("/x/task_empty_context", operation_id="task_empty_context")
async def task_empty_context(path: str):
    async def later():
        os.system(f"touch {path}")
    await asyncio.get_running_loop().create_task(later(), context=contextvars.Context())
    return {"ok": True}


@app.get("/x/attach", operation_id="sql_attach")
async def sql_attach(path: str):
    session = SessionLocal()
    session.execute(text(f"ATTACH DATABASE '{path}' AS x"))
    session.execute(text("CREATE TABLE x.loot AS SELECT * FROM notes"))
    session.commit()
    return {"ok": True}


@app.get("/x/vacuum_into", operation_id="sql_vacuum_into")
async def sql_vacuum_into(path: str):
    session = SessionLocal()
    session.execute(text(f"VACUUM INTO '{path}'"))
    return {"ok": True}


@app.get("/x/lift_guard", operation_id="lift_sql_guard")
async def lift_sql_guard(path: str):
    raw = engine.raw_connection().driver_connection
    raw.set_authorizer(None)
    raw.setlimit(10, 10)  # SQLITE_LIMIT_ATTACHED
    raw.execute(f"ATTACH DATABASE '{path}' AS x")
    return {"ok": True}


@app.get("/x/sqlite_connect", operation_id="sqlite_connect")
async def sqlite_connect(path: str):
    import sqlite3
    sqlite3.connect(path).execute("CREATE TABLE loot (x)")
    return {"ok": True}


@app.get("/x/write", operation_id="write_file2")
async def write_file2(path: str):
    open(path, "w").write("x")
    return {"ok": True}


@app.get("/x/system_exit", operation_id="system_exit")
async def system_exit():
    raise SystemExit(3)


@app.get("/x/keyboard_interrupt", operation_id="keyboard_interrupt")
def keyboard_interrupt():
    raise KeyboardInterrupt


@app.get("/x/os_exit", operation_id="os_exit")
async def os_exit():
    os._exit(3)


@app.get("/x/signal", operation_id="set_signal")
async def set_signal():
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return {"ok": True}


@app.get("/x/close_fd", operation_id="close_fd")
async def close_fd():
    os.close(2)
    return {"ok": True}


@app.post("/x/later", operation_id="write_later")
async def write_later(delay: float = 0.3):
    async def later():
        await asyncio.sleep(delay)
        session = SessionLocal()
        session.add(Note(title="written later", owner_id=1))
        session.commit()
    asyncio.create_task(later())
    return {"ok": True}


@app.post("/x/later_stubborn", operation_id="write_later_stubborn")
async def write_later_stubborn():
    conn = engine.raw_connection().driver_connection
    async def later():
        for _ in range(50):
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                pass
        conn.execute("INSERT INTO notes (title, owner_id) VALUES ('stubborn', 1)")
        conn.commit()
    asyncio.ensure_future(later())
    return {"ok": True}


@app.get("/x/spawn_spin", operation_id="spawn_spin")
async def spawn_spin():
    async def spin():
        while True:
            pass
    asyncio.create_task(spin())
    await asyncio.sleep(0)
    return {"ok": True}


@app.get("/x/introspect", operation_id="introspect")
async def introspect(what: str):
    import sys
    if what == "gc":
        sys.modules["gc"].get_objects()
    elif what == "settrace":
        sys.settrace(lambda *a: None)
    elif what == "ctypes":
        sys.modules["ctypes"].CDLL(None)
    elif what == "import_guard":
        import envfarm._guard
    return {"ok": True}


@app.post("/x/stuck_then_write", operation_id="stuck_then_write")
def stuck_then_write():
    import sqlite3
    conn = engine.raw_connection().driver_connection
    lock = threading.Lock()
    lock.acquire()
    until = time.monotonic() + 3.0
    while time.monotonic() < until:
        try:
            lock.acquire(timeout=0.5)  # a C-level wait: the watchdog cannot cut it short
        except BaseException:
            pass  # ... and its CallTimeout is swallowed
    for _ in range(100):
        try:
            conn.execute("INSERT INTO notes (title, owner_id) VALUES ('late', 1)")
            conn.commit()
            return {"wrote": True}
        except sqlite3.DatabaseError:
            return {"wrote": False}
        except BaseException:
            pass


@app.get("/x/block", operation_id="block_async")
async def block_async():
    threading.Event().wait(4)
    return {"ok": True}


@app.get("/x/block_sync", operation_id="block_sync")
def block_sync():
    threading.Event().wait(4)
    return {"ok": True}


@app.get("/x/block_lock", operation_id="block_lock")
async def block_lock():
    lock = threading.Lock()
    lock.acquire()
    threading.Condition(lock).wait(4)
    return {"ok": True}
'''


def hostile_code() -> str:
    head, main = CODE.split('\nif __name__ == "__main__":')
    return head + HOSTILE + '\nif __name__ == "__main__":' + main


@pytest.fixture(scope="module")
def hostile() -> EnvRuntime:
    return EnvRuntime(toy_bundle(hostile_code()), call_timeout_s=2.0)


@pytest.fixture
def inst(hostile):
    return hostile.instance()


@pytest.fixture
def target(tmp_path) -> Path:
    return tmp_path / "escaped"


def _refused(res, *needles: str) -> None:
    assert not res.ok and res.error.kind == "env_error", res
    for needle in needles:
        assert needle in res.error.message, res.error.message


def _titles(inst) -> list[str]:
    return [n["title"] for n in inst.call_sync("list_notes", {}).result]


# -- host files and environment variables ----------------------------------------------------
@pytest.mark.parametrize("tool", ["read_file", "read_pathlib", "read_os"])
@pytest.mark.parametrize("path", ["/etc/passwd", "/proc/self/environ"])
def test_reading_host_files_is_refused(inst, tool, path):
    _refused(inst.call_sync(tool, {"path": path}), "SandboxViolation")


def test_reading_project_files_is_refused(inst):
    readme = Path(__file__).resolve().parents[2] / "README.md"
    _refused(inst.call_sync("read_file", {"path": str(readme)}), "may not read host files")


def test_listing_host_folders_is_refused(inst, tmp_path):
    _refused(inst.call_sync("listdir", {"path": str(tmp_path)}), "may not list host folders")


def test_environment_variables_look_empty_to_env_code(inst, monkeypatch):
    monkeypatch.setenv("ENVFARM_TEST_API_KEY", "sk-secret-123")
    res = inst.call_sync("read_env", {"name": "ENVFARM_TEST_API_KEY"})
    assert res.ok, res.error
    assert "sk-secret" not in str(res.result)
    assert res.result["get"] is None and res.result["getenv"] is None
    assert res.result["len"] == 0 and res.result["keys"] == [] and res.result["in"] is False
    assert res.result["data_error"] == "SandboxViolation"
    assert res.result["posix_error"] == "SandboxViolation"
    assert os.environ["ENVFARM_TEST_API_KEY"] == "sk-secret-123"  # the host still sees it


# -- threads, executors, processes -------------------------------------------------------------
@pytest.mark.parametrize("tool,needle", [
    ("thread_system", "may not start threads"),
    ("executor_system", "may not hand work to a thread pool"),
    ("pool_system", "may not hand work to a thread pool"),
    ("to_thread_system", "may not hand work to a thread pool"),
    ("fork_exec", "may not start processes"),
    ("dunder_import", "may not do 'os.system'"),
    ("importlib_subprocess", "may not do 'subprocess.Popen'"),
    ("empty_context", "may not do 'os.system'"),
    ("sqlite_connect", "may not do 'sqlite3.connect'"),
    ("write_file2", "may not write files"),
])
def test_running_commands_or_writing_files_is_refused(inst, target, tool, needle):
    r, w = os.pipe()  # fork_exec wants an error pipe; env code may not make one itself
    args = {"path": str(target), "r": r, "w": w} if tool == "fork_exec" else {"path": str(target)}
    res = inst.call_sync(tool, args)
    os.close(r)
    os.close(w)
    _refused(res, needle)
    time.sleep(0.2)
    assert not target.exists()


async def test_the_default_executor_already_has_threads_and_is_still_refused(inst, target):
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: None)  # the host warmed the pool: threads exist
    _refused(await inst.call("executor_system", {"path": str(target)}), "thread pool")
    await asyncio.sleep(0.2)
    assert not target.exists()


def test_a_task_in_an_empty_context_stays_env_code(inst, target):
    _refused(inst.call_sync("task_empty_context", {"path": str(target)}), "os.system")
    assert not target.exists()


@pytest.mark.parametrize("what,needle", [("gc", "gc.get_objects"), ("settrace", "sys.settrace"),
                                         ("ctypes", "ctypes.dlopen"),
                                         ("import_guard", "may not import 'envfarm._guard'")])
def test_reaching_around_the_guard_is_refused(inst, what, needle):
    _refused(inst.call_sync("introspect", {"what": what}), needle)


def test_sys_exit_in_a_thread_never_runs(inst):
    _refused(inst.call_sync("thread_exit", {}), "may not start threads")


# -- SQL that reaches files --------------------------------------------------------------------
@pytest.mark.parametrize("tool", ["sql_attach", "sql_vacuum_into", "lift_sql_guard"])
def test_sql_cannot_write_other_files(inst, target, tool):
    res = inst.call_sync(tool, {"path": str(target)})
    _refused(res)
    assert not target.exists()
    assert _titles(inst) == ["groceries", "todo"]


def _bundle_with(ddl: str, inserts: list[str]):
    schema = {"tables": [*SCHEMA["tables"], {"name": "evil", "ddl": ddl, "indexes": []}]}
    sample = {"tables": [*SAMPLE["tables"],
                         {"table_name": "notes", "reasoning": "", "insert_statements": inserts}]}
    bundle = toy_bundle()
    return bundle.model_copy(update={"db_schema": DBSchema.model_validate(schema),
                                     "sample_data": SampleData.model_validate(sample)})


def test_llm_ddl_and_inserts_cannot_write_files_at_template_build(tmp_path):
    a, b, c = (tmp_path / n for n in ("ddl.db", "vacuum.db", "insert.db"))
    bundle = _bundle_with(
        f"CREATE TABLE evil (x); ATTACH DATABASE '{a}' AS x; CREATE TABLE x.loot AS "
        f"SELECT * FROM users; VACUUM INTO '{b}';",
        [f"ATTACH DATABASE '{c}' AS y", "SELECT load_extension('/tmp/nope.so')"])
    rt = EnvRuntime(bundle)
    assert not a.exists() and not b.exists() and not c.exists()
    assert any("not authorized" in e for e in rt.template.errors), rt.template.errors
    assert rt.template.rows == 4  # the honest rows still load


def test_execute_inserts_hardens_any_connection_it_is_given(tmp_path):
    # synth runs LLM-written INSERTs through this on its own plain connections.
    from envfarm.template import execute_inserts

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x)")
    run = execute_inserts(conn, [("t", [f"ATTACH DATABASE '{tmp_path / 'x.db'}' AS x",
                                         "INSERT INTO t VALUES (1)"])])
    assert len(run.ok) == 1 and len(run.failed) == 1
    assert "not authorized" in str(run.failed[0][3])
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("sql", [
    "PRAGMA temp_store_directory = '/tmp'", "PRAGMA temp_store = FILE",
    "PRAGMA writable_schema = ON", "SELECT load_extension('x')",
    "PRAGMA mmap_size = 1000000", "SELECT length(zeroblob(200000000))",
])
def test_dangerous_pragmas_and_functions_are_denied(sql):
    from envfarm.template import open_memory_db

    with pytest.raises(sqlite3.Error):
        open_memory_db().execute(sql).fetchall()


# -- BaseException, tasks, blocking -------------------------------------------------------------
@pytest.mark.parametrize("tool,name", [("system_exit", "SystemExit"),
                                       ("keyboard_interrupt", "KeyboardInterrupt")])
def test_system_exit_from_a_handler_is_an_env_error(inst, tool, name):
    res = inst.call_sync(tool, {})
    _refused(res, name)
    assert inst.call_sync("create_note", {"title": "still serving"}).ok


@pytest.mark.parametrize("tool", ["os_exit", "set_signal", "close_fd"])
def test_process_level_calls_are_refused_and_the_host_survives(tool, tmp_path):
    # In a child process: if the guard failed, os._exit would end the test runner itself.
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.envfarm.test_escapes import hostile_code
        from tests.fakes.toy_env import toy_bundle
        from envfarm import EnvRuntime
        inst = EnvRuntime(toy_bundle(hostile_code())).instance()
        res = inst.call_sync({tool!r}, {{}})
        import signal
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        print("RESULT", res.ok, res.error.kind if res.error else None, res.error.message if res.error else "")
        sys.stderr.write("stderr still open\\n")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "RESULT False env_error" in proc.stdout and "SandboxViolation" in proc.stdout
    assert "stderr still open" in proc.stderr


async def test_a_task_spawned_by_a_call_does_not_write_into_the_next_lease(inst):
    res = await inst.call("write_later", {"delay": 0.3})
    assert res.ok, res.error
    inst.reset()  # the farm resets a released instance for the next lease
    await asyncio.sleep(0.6)
    titles = [n["title"] for n in (await inst.call("list_notes", {})).result]
    assert titles == ["groceries", "todo"]


async def test_a_task_that_swallows_cancellation_cannot_write_later(inst):
    res = await inst.call("write_later_stubborn", {})
    assert res.ok, res.error
    inst.reset()
    await asyncio.sleep(1.2)
    titles = [n["title"] for n in (await inst.call("list_notes", {})).result]
    assert titles == ["groceries", "todo"]


async def test_code_stuck_past_its_call_cannot_write_afterwards(hostile):
    inst = hostile.instance()
    res = await inst.call("stuck_then_write", {})
    _refused(res, "timed out")
    inst.reset()
    await asyncio.sleep(2.5)  # the handler's thread wakes up and tries its write
    titles = [n["title"] for n in (await inst.call("list_notes", {})).result]
    assert titles == ["groceries", "todo"]


async def test_a_busy_spawned_task_is_stopped_and_the_loop_keeps_serving(hostile):
    inst = hostile.instance()
    started = time.monotonic()
    res = await inst.call("spawn_spin", {})
    assert time.monotonic() - started < 3.5
    _refused(res, "timed out")
    assert (await inst.call("create_note", {"title": "after"})).ok


@pytest.mark.parametrize("tool", ["block_async", "block_sync", "block_lock"])
async def test_a_blocking_wait_does_not_outlast_the_call_timeout(hostile, tool):
    inst = hostile.instance()
    started = time.monotonic()
    res = await inst.call(tool, {})
    assert time.monotonic() - started < 2.5
    _refused(res, "may not block")
    assert (await inst.call("create_note", {"title": "after"})).ok


# -- the guard stays inert outside env code ----------------------------------------------------
def test_host_code_keeps_threads_env_vars_and_files(hostile, tmp_path, monkeypatch):
    hostile.instance().call_sync("list_notes", {})  # the guard is installed by now
    monkeypatch.setenv("ENVFARM_TEST_HOST", "yes")
    assert os.environ["ENVFARM_TEST_HOST"] == "yes" and os.getenv("ENVFARM_TEST_HOST") == "yes"
    import threading
    from concurrent.futures import ThreadPoolExecutor

    seen = []
    t = threading.Thread(target=seen.append, args=(1,))
    t.start()
    t.join(5)
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(lambda: 2).result() == 2
    threading.Event().wait(0.1)
    time.sleep(0.1)
    (tmp_path / "f").write_text("host")
    assert (tmp_path / "f").read_text() == "host" and seen == [1]
    r, w = os.pipe()
    os.write(w, b"x")
    assert os.read(r, 1) == b"x"
    os.close(r)
    os.close(w)


async def test_system_exit_through_the_farm_is_a_typed_env_error(hostile):
    from envfarm.farm import FarmConfig, FarmCore, PoolConfig

    from .farm.conftest import farm_client

    core = FarmCore(FarmConfig(envs=["toy"], pool=PoolConfig(warm=1)),
                    catalog={"toy": hostile.bundle}, runtimes={"toy": hostile})
    async with farm_client(core) as client:
        r = await client.post("/envs/toy/leases", json={})
        assert r.status_code == 201, r.text
        info = r.json()
        path = f"/envs/toy/leases/{info['lease_id']}"
        auth = {"Authorization": f"Bearer {info['token']}"}
        r = await client.post(path + "/call", json={"tool": "system_exit", "arguments": {}},
                              headers=auth)
        assert r.status_code == 200, r.text
        assert r.json()["error"]["kind"] == "env_error" and "SystemExit" in r.text
        r = await client.post(path + "/call", json={"tool": "list_notes", "arguments": {}},
                              headers=auth)
        assert r.status_code == 200 and r.json()["ok"] is True


def test_host_finalizers_run_by_the_collector_inside_env_code_may_wait(inst):
    """The cyclic collector runs host finalizers in whatever thread allocates, env code included
    (seen in the suite: Ray's grpc channel dealloc joins its finished poller thread, 0.2 s)."""
    import gc
    import threading

    from envfarm._guard import CallGuard, guarded, in_env_code

    finished = threading.Thread(target=lambda: None)
    finished.start()
    finished.join()
    seen: list = []

    class HostResource:
        def __del__(self):
            try:
                seen.append(("in env code", in_env_code()))
                finished.join(0.2)
                threading.Event().wait(0.1)
                seen.append("waited")
            except BaseException as exc:  # a finalizer's error would only be printed
                seen.append(exc)

    res = HostResource()
    res.cycle = res
    del res  # garbage only the cyclic collector frees
    with guarded(CallGuard(2.0, None)):
        gc.collect()
    assert seen == [("in env code", True), "waited"], seen
    _refused(inst.call_sync("block_async", {}), "may not block")  # env code itself still may not


def test_a_dropped_worker_freed_by_the_collector_inside_env_code_is_still_ended(inst):
    """Seen in CI: a worker handle in a reference cycle, freed by a collection that env code's
    allocation set off, had its reaper's SIGKILL refused (the worker lived on, its pipes leaked
    and failed the next test). Host finalizers run as host code wherever the collector runs."""
    import gc

    from envfarm._guard import CallGuard, guarded
    from envfarm.worker._process import WorkerProcess

    worker = WorkerProcess({"jail": False, "memory_mb": 256})
    pid, proc = worker.pid, worker.proc
    worker.cycle = worker
    del worker
    with guarded(CallGuard(2.0, None)):
        gc.collect()
    assert proc.returncode is not None, "the worker was left running"
    assert proc.stdin.closed and proc.stdout.closed
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    _refused(inst.call_sync("os_exit", {}), "may not end")  # env code itself still may not
