"""What keeps a fresh-process verification cheap (issue 35), and that it stays fresh: the
zygote carries no after-fork hooks nor libseccomp, each child reseeds random for itself,
connections to a staged database share one read-only cache and run no Python to make their
statement caches, and a final snapshot is staged for its one call only."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from envfarm.confined.jail import read_ruleset, support
from judge import _sandbox_harness
from judge._sandbox_worker import JOB
from judge._staging import Stager
from judge._zygote import Job
from tests.judge.test_verifier_isolation import HONEST, _code

needs_jail = pytest.mark.skipif(not support().ok, reason=f"kernel lacks: {support().describe()}")


@needs_jail
def test_the_zygote_loads_neither_threading_nor_libseccomp(sandbox, small_dbs):
    # threading's after-fork hook ran in every child (~0.3 ms); pyseccomp pulls it in.
    res = sandbox.run_sync(_code("""
mods = g['sys'].modules
return {'result': 'others', 'loaded': [m for m in ('threading', 'pyseccomp', 'subprocess')
                                        if m in mods]}
"""), *small_dbs)
    assert res.ok, res.error
    assert res.result["loaded"] == []
    (zygote,) = sandbox.pids
    assert "libseccomp" not in Path(f"/proc/{zygote}/maps").read_text()


@needs_jail
def test_each_verification_gets_its_own_random_state(sandbox, small_dbs):
    # The zygote skips random's after-fork reseed; a child that imports random reseeds it.
    code = ("def verify_task(a, b):\n    import random\n"
            "    return {'draws': [random.random() for _ in range(3)]}\n")
    draws = [sandbox.run_sync(code, *small_dbs).result["draws"] for _ in range(3)]
    assert len({tuple(d) for d in draws}) == 3


@needs_jail
def test_connections_share_a_cache_and_stay_read_only(sandbox, small_dbs):
    code = """
def verify_task(a, b):
    import sqlite3
    counts = []
    for _ in range(3):  # as LLM-written verifiers do: a connection per query
        conn = sqlite3.connect(b)
        counts.append(conn.execute('SELECT COUNT(*) FROM t').fetchone()[0])
        conn.close()
    conn = sqlite3.connect(b)
    conn.execute('CREATE TEMP TABLE seen (x)')
    conn.execute('INSERT INTO seen SELECT x FROM t')
    temp = conn.execute('SELECT COUNT(*) FROM seen').fetchone()[0]
    try:
        conn.execute('DELETE FROM t')
        write = 'allowed'
    except sqlite3.OperationalError as exc:
        write = str(exc)
    return {'counts': counts, 'temp': temp, 'write': write}
"""
    res = sandbox.run_sync(code, *small_dbs)
    assert res.ok, res.error
    assert res.result == {"counts": [2, 2, 2], "temp": 2,
                          "write": "attempt to write a readonly database"}
    assert sqlite3.connect(small_dbs[1]).execute("SELECT COUNT(*) FROM t").fetchone()[0] == 2


@needs_jail
def test_a_job_without_its_landlock_layer_gets_no_child(sandbox, small_dbs):
    # The front makes each child's Landlock layer (its two databases, not the whole staging
    # folder) and sends it with the job: a job without one must not run.
    assert sandbox.run_sync(HONEST, *small_dbs).ok
    zygote = sandbox._zygote()
    started = {}
    for job_id, with_layer in ((0xFFFF_FF00, False), (0xFFFF_FF01, True)):
        (req_r, req_w), (rep_r, rep_w) = os.pipe(), os.pipe()
        os.close(req_w)
        fds = [req_r, rep_w]
        if with_layer:
            fds.append(read_ruleset([str(small_dbs[0])], zygote._roots))
        job = Job()
        with zygote._lock:
            zygote._jobs[job_id] = job
        socket.send_fds(zygote._sock, [JOB.pack(job_id, 5.0)], fds)
        for fd in fds:
            os.close(fd)
        started[with_layer] = job.started.wait(1.0)
        zygote.forget(job_id)
        os.close(rep_r)
    assert started == {False: False, True: True}


def test_a_connection_makes_its_statement_cache_without_python():
    # sqlite3 makes each connection's statement cache with functools.lru_cache, whose
    # update_wrapper is Python: pages copied in every child, once per connection.
    probe = f"""
import functools, json, runpy, sys
harness = runpy.run_path({str(Path(_sandbox_harness.__file__))!r}, run_name="probe")
calls = []
sys.setprofile(lambda frame, event, arg: event == "call" and calls.append(
    frame.f_code.co_filename + ":" + frame.f_code.co_name))
conn = harness["sqlite3"].connect(":memory:")
rows = [conn.execute("SELECT ?", (i,)).fetchone()[0] for i in range(3)]  # cached statement
sys.setprofile(None)
print(json.dumps({{"functools": [c for c in calls if "functools" in c], "rows": rows,
                   "lru_cache": functools.lru_cache.__module__}}))
"""
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout) == {"functools": [], "rows": [0, 1, 2],
                                      "lru_cache": "functools"}


def _db(rows: int) -> bytes:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(rows)])
    conn.commit()
    return conn.serialize()


def test_a_kept_snapshot_is_staged_once_and_a_final_one_for_its_call():
    stager = Stager()
    try:
        template, final = _db(3), _db(4)
        kept, cached = stager.stage(template, keep=True)
        again, cached_again = stager.stage(template, keep=True)
        assert (again, cached, cached_again) == (kept, True, True)
        twin = template[:-1] + template[-1:]  # equal bytes, another object: no hash to match
        assert twin is not template and stager.stage(twin, keep=True)[0] != kept
        path, cached = stager.stage(final)
        assert not cached and Path(path).read_bytes() == final
        assert os.stat(path).st_mode & 0o777 == 0o444
        stager.release(path, cached)
        assert not Path(path).exists()
        stager.release(kept, True)
        stager.release(again, True)
        assert Path(kept).exists()  # kept for the next verification of the same env
    finally:
        stager.close()


def test_a_path_staged_by_concurrent_calls_is_never_replaced_under_them(tmp_path):
    # Each caller's verifier gets a Landlock rule on the staged file's inode: a second copy
    # renamed over it (two calls missing the cache at once) left the first one's child unable
    # to open its database ("unable to open database file", 20 concurrent runs).
    import threading

    src = tmp_path / "a.db"
    src.write_bytes(_db(20_000))
    for _ in range(10):
        stager = Stager()
        barrier, got = threading.Barrier(8), []

        def stage() -> None:
            barrier.wait()
            path, cached = stager.stage(src)
            got.append((path, os.stat(path).st_ino, cached))

        try:
            threads = [threading.Thread(target=stage) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len({path for path, _, _ in got}) == 1 and all(cached for *_, cached in got)
            assert {ino for _, ino, _ in got} == {os.stat(got[0][0]).st_ino}
            assert len(os.listdir(stager.dir)) == 1  # the losers' copies removed
            for path, _, cached in got:
                stager.release(path, cached)
            assert stager._pins == {}
        finally:
            stager.close()


def test_kept_snapshots_are_evicted_least_recently_used_first():
    stager = Stager(keep=2)
    try:
        dbs = [_db(i) for i in range(3)]
        paths = []
        for db in dbs:
            path, cached = stager.stage(db, keep=True)
            stager.release(path, cached)
            paths.append(path)
        assert [Path(p).exists() for p in paths] == [False, True, True]
        path, _ = stager.stage(dbs[0], keep=True)  # evicted: staged again, under a new name
        assert path != paths[0] and Path(path).read_bytes() == dbs[0]
    finally:
        stager.close()
