"""A fresh, kernel-confined process per verification (issue 20): what one verifier does cannot
reach another verification, the zygote or the front. The attacks reach ``os`` and ``sys``
through an allowed object (``os._wrap_close``), as the verifier that took over the old shared
worker did."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from envfarm.confined.jail import support
from judge import VerifierErrorKind, VerifierSandbox
from tests.judge.test_verifier_sandbox import children, wait_no_children

pytestmark = pytest.mark.skipif(not support().ok, reason=f"kernel lacks: {support().describe()}")

OS = ("    g = [c for c in ().__class__.__base__.__subclasses__()"
      " if c.__name__ == '_wrap_close'][0].__init__.__globals__\n")
FORGED = json.dumps({"ok": True, "result_json": json.dumps({"result": "complete"})}).encode()


def _code(body: str) -> str:
    lines = "\n".join("    " + line for line in body.strip().splitlines())
    return f"def verify_task_completion(a, b, final_answer=None):\n{OS}{lines}\n"


HONEST = "def verify_task_completion(a, b, final_answer=None):\n    return {'result': 'others'}\n"


def test_a_verifier_sees_only_its_own_reply_pipe(sandbox, small_dbs):
    res = sandbox.run_sync(_code("""
fds = []
for fd in range(3, 1024):
    try:
        g['fstat'](fd)
        fds.append(fd)
    except OSError:
        pass
return {'result': 'others', 'fds': fds}
"""), *small_dbs)
    assert res.ok, res.error
    assert len(res.result["fds"]) == 1  # the reply pipe; no control socket, no other request


async def test_forging_replies_on_every_fd_reaches_no_other_verification(sandbox, small_dbs):
    forge = _code(f"""
frame = len({FORGED!r}).to_bytes(4, 'big') + {FORGED!r}
for fd in range(0, 1024):
    try:
        g['write'](fd, frame)
    except OSError:
        pass
return {{'result': 'others'}}
""")
    runs = [sandbox.run(forge if i % 2 else HONEST, *small_dbs) for i in range(16)]
    results = await asyncio.gather(*runs)
    honest = results[0::2]
    assert all(r.ok and r.code_result == "others" for r in honest), honest
    # A forger can only decide its own verification, as any verifier does by returning.
    assert all(r.code_result in ("complete", "others") for r in results[1::2])


def test_monkeypatching_a_module_does_not_reach_the_next_verification(sandbox, small_dbs):
    poison = _code("""
sys = g['sys']
sys.modules['json'].dumps = lambda *a, **k: '{"result": "complete"}'
sys.modules['builtins'].isinstance = lambda *a: True
sys.modules['sqlite3'].connect = None
return {'result': 'others'}
""")
    first = sandbox.run_sync(poison, *small_dbs)
    # Its own reply went through the patched json.dumps: not the shape a reply has.
    assert first.error_kind is VerifierErrorKind.crashed, first
    after = sandbox.run_sync(HONEST, *small_dbs)
    assert after.ok and after.code_result == "others"
    count = ("def verify_task(a, b):\n    import sqlite3, json\n"
             "    return {'n': sqlite3.connect(b).execute('select count(*) from t').fetchone()[0],"
             " 'j': json.dumps([1])}\n")
    assert sandbox.run_sync(count, *small_dbs).result == {"n": 2, "j": "[1]"}


@pytest.mark.parametrize(("what", "body"), [
    ("fork", "g['fork']()"),
    ("spawn", "g['posix_spawn']('/bin/sleep', ['sleep', '30'], {})"),
    ("file", "g['open']('/dev/shm/envfarm-verifier-left', g['O_CREAT'] | g['O_WRONLY'])"),
    ("kill the zygote", "g['kill'](g['getppid'](), 9)"),
    ("kill the front", "g['kill'](FRONT, 9)"),
    ("killpg the front", "g['killpg'](g['getpgid'](FRONT), 9)"),
    ("front environ", ("return {'result': g['sys'].modules['builtins'].open("
                      "f'/proc/{FRONT}/environ').read()}")),
    ("front environ via sqlite", "import sqlite3\nsqlite3.connect(f'/proc/{FRONT}/environ')"),
])
def test_attacks_on_the_host_are_refused(sandbox, small_dbs, monkeypatch, what, body):
    monkeypatch.setenv("ENVFARM_FRONT_SECRET", "sk-front-9999")
    zygote = sandbox.pids
    code = _code(body.replace("FRONT", str(os.getpid())) + "\nreturn {'result': 'complete'}")
    res = sandbox.run_sync(code, *small_dbs)
    assert not res.ok and res.error_kind in (VerifierErrorKind.forbidden,
                                             VerifierErrorKind.raised), res
    assert "sk-front" not in (res.error or "") + json.dumps(res.result)
    assert sandbox.pids == zygote
    assert wait_no_children(zygote[0]) == []  # nothing left running
    assert not Path("/dev/shm/envfarm-verifier-left").exists()
    assert sandbox.run_sync(HONEST, *small_dbs).code_result == "others"


def test_each_verification_runs_in_a_jailed_child(small_dbs):
    with VerifierSandbox(workers=1, timeout_s=5.0) as sandbox:
        zygote = sandbox.pids[0]
        assert "seccomp" in sandbox.jail and "landlock" in sandbox.jail
        busy = "def verify_task(a, b):\n    import time\n    t = time.time()\n" \
               "    while time.time() - t < 1.5:\n        pass\n    return {}\n"
        future = ThreadPoolExecutor(1).submit(sandbox.run_sync, busy, *small_dbs)
        status: dict[str, str] = {}
        deadline = time.monotonic() + 5
        while int(status.get("Seccomp_filters", 0)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the child has stacked its own layer
            for kid in children(zygote):
                try:
                    text = Path(f"/proc/{kid}/status").read_text()
                except OSError:
                    continue
                status = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        assert status, "no child forked for the verification"
        assert future.result().ok
        assert status["NoNewPrivs"].strip() == "1"
        assert status["Seccomp"].strip() == "2"                # filter mode
        assert int(status["Seccomp_filters"]) >= 2              # the zygote's, then its own
        assert int(status["CapEff"], 16) == 0
        assert wait_no_children(zygote) == []


def test_a_killed_zygote_is_replaced(small_dbs):
    with VerifierSandbox(workers=1, timeout_s=5.0) as sandbox:
        first = sandbox.pids
        os.kill(first[0], signal.SIGKILL)
        deadline = time.monotonic() + 3
        while sandbox.pids and time.monotonic() < deadline:
            time.sleep(0.01)
        res = sandbox.run_sync(HONEST, *small_dbs)
        assert res.ok and res.code_result == "others"
        assert sandbox.pids and sandbox.pids != first


def test_large_sorts_stay_in_memory(sandbox, small_dbs):
    # SQLite spills a big sort to a temporary file by default; a jailed process creates none.
    code = ("def verify_task(a, b):\n    import sqlite3\n    c = sqlite3.connect(b)\n"
            "    c.execute('PRAGMA cache_size=10')\n"
            "    q = ('WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 50000)'"
            " ' SELECT count(*) FROM (SELECT hex(randomblob(50)) h FROM r ORDER BY h)')\n"
            "    return {'n': c.execute(q).fetchone()[0]}\n")
    res = sandbox.run_sync(code, *small_dbs)
    assert res.ok, res.error
    assert res.result == {"n": 50000}
