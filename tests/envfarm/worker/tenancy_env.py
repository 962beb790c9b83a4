"""Env code that attacks other tenants, other leases and the front through the worker (issue 34).

Each tool reports what it did; the tests judge the outcome from the front's side. The guard
inside a worker is switched off where an attack needs it (``host_code``: one line, as the issue
says; the kernel and the front are what must hold).
"""

from tests.envfarm.worker.hostile_env import with_code

TENANCY = '''
import asyncio as _asyncio
import importlib as _importlib
import sys as _sys


def _host():
    return _sys.modules["envfarm._guard"].host_code()


def _transport(kind):
    """A transport of the worker's loop by class name (``_UnixReadPipeTransport``: its channel)."""
    loop = _asyncio.get_running_loop()
    for key in list(loop._selector.get_map().values()):
        for handle in key.data:
            owner = getattr(getattr(handle, "_callback", None), "__self__", None)
            if owner is not None and type(owner).__name__ == kind:
                return owner
    return None


def _own_request_id():
    frame = _sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "_answer" and "header" in frame.f_locals:
            return frame.f_locals["header"].get("id")
        frame = frame.f_back
    return None


def _channel_fd():
    """The write end of the worker's channel: the one pipe fd a zero-byte write accepts."""
    posix = _sys.modules["posix"]
    for fd in range(3, 64):
        try:
            if (posix.fstat(fd).st_mode & 0o170000) == 0o010000 and posix.write(fd, b"") == 0:
                return fd
        except OSError:
            continue
    return None


def _frame(header, payload=b""):
    head = header if isinstance(header, bytes) else _sys.modules["json"].dumps(header).encode()
    return (b"".join(((4 + len(head) + len(payload)).to_bytes(4, "big"),
                      len(head).to_bytes(4, "big"), head, payload)))


@app.get("/t/nap", operation_id="nap")
async def nap(seconds: float):
    await _asyncio.sleep(seconds)
    return {"slept": seconds}


@app.post("/t/nap_note", operation_id="nap_then_note")
async def nap_then_note(seconds: float, title: str):
    """A write that is in flight for a while: it commits only after the nap."""
    await _asyncio.sleep(seconds)
    session = SessionLocal()
    session.add(Note(title=title, owner_id=1))
    session.commit()
    session.close()
    return {"noted": title}


@app.post("/t/bloat", operation_id="bloat")
async def bloat(kib: int):
    """Grow this lease's database by ``kib`` KiB (in one note's title)."""
    session = SessionLocal()
    session.add(Note(title="b" * (kib << 10), owner_id=1))
    session.commit()
    session.close()
    return {"grew_kib": kib}


@app.post("/t/hang", operation_id="hang_in_c")
async def hang_in_c(after: float = 0.0):
    await _asyncio.sleep(after)
    return pow(3, 10 ** 9) > 0  # one C call, minutes long: the worker answers nothing


@app.post("/t/crash", operation_id="crash")
async def crash(after: float = 0.0):
    await _asyncio.sleep(after)
    _sys.modules["posix"]._exit(3)


@app.post("/t/alarm", operation_id="alarm")
async def alarm(seconds: int = 1, wait: float = 3.0):
    """SIGALRM's default action ends the process: the whole worker dies with this call."""
    with _host():
        _importlib.import_module("_signal").alarm(seconds)
    await _asyncio.sleep(wait)
    return {"survived": True}


@app.post("/t/swallow", operation_id="swallow_on_the_loop")
async def swallow_on_the_loop():
    """The careless retry loop, on the event loop: it swallows its own timeout forever."""
    while True:
        try:
            while True:
                pass
        except:  # noqa: E722
            continue


@app.get("/t/whoami", operation_id="whoami")
async def whoami():
    return {"pid": _sys.modules["posix"].getpid()}


@app.post("/t/poison", operation_id="poison")
async def poison():
    """Patch the worker's runtime: every lease's list_notes and snapshot there are forged."""
    runtime = _sys.modules["envfarm.runtime"]
    call, snapshot = runtime.Instance.call, runtime.Instance.snapshot

    async def forged_call(self, tool, arguments=None):
        res = await call(self, tool, arguments)
        if tool == "list_notes" and res.ok:
            res.result = list(res.result) + [{"id": 999, "title": "forged-by-a-neighbour"}]
        return res

    def forged_snapshot(self):
        import sqlite3
        conn = sqlite3.connect(":memory:")
        conn.deserialize(snapshot(self))
        conn.execute("INSERT INTO notes (title, owner_id) VALUES ('forged-by-a-neighbour', 1)")
        conn.commit()
        return conn.serialize()

    with _host():
        runtime.Instance.call = forged_call
        runtime.Instance.snapshot = forged_snapshot
        runtime.Instance.committed = forged_snapshot
    return {"poisoned": True}


@app.post("/t/spin", operation_id="spin_thread")
async def spin_thread():
    """A thread that spins on after the call (and the lease) is gone."""
    def spin():
        while True:
            pass
    with _host():
        _importlib.import_module("_thread").start_new_thread(spin, ())
    return {"spinning": True}


@app.post("/t/deaf", operation_id="stop_reading")
async def stop_reading():
    """The worker stops reading its channel (its answers to later calls never come)."""
    transport = _transport("_UnixReadPipeTransport")
    with _host():
        transport.pause_reading()
    return {"deaf": transport is not None}


@app.post("/t/huge", operation_id="huge_uncapped")
async def huge_uncapped(mib: int = 60):
    """Lift the worker's answer cap (a module constant here) and answer ``mib`` MiB."""
    with _host():
        _sys.modules["envfarm.worker._main"].MAX_RESULT_BYTES = 1 << 40
    return {"blob": "x" * (mib << 20)}


@app.post("/t/forge", operation_id="forge_frames")
async def forge_frames(kind: str, count: int = 1):
    """Write frames of our own into the channel, as the worker's own answers."""
    fd, rid = _channel_fd(), _own_request_id()
    if kind == "unsolicited_big":
        data = _frame({"id": 10 ** 9, "ok": True}, b"x" * (60 << 20))
    elif kind == "nested_header":
        data = _frame(b'{"id":1,"ok":true,"x":' + b"[" * 20 + b"[1]," * (6 << 20) + b"1"
                      + b"]" * 20 + b"}")
    elif kind == "deep_header":
        data = _frame(b"[" * 200_000 + b"]" * 200_000)
    elif kind == "big_answer_own_id":
        data = _frame({"id": rid, "ok": True}, b"x" * (60 << 20))
    elif kind == "duplicate":
        body = b'{"ok":true,"result":"forged","status":200,"elapsed_ms":0}'
        data = _frame({"id": rid, "ok": True}, body) * count
    else:
        return {"unknown": kind}
    posix = _sys.modules["posix"]
    with _host():
        view = memoryview(data)
        while view:
            try:
                view = view[posix.write(fd, view):]
            except BlockingIOError:
                await _asyncio.sleep(0.001)
    return {"written": len(data), "fd": fd, "rid": rid}
'''

CODE = with_code(TENANCY)
