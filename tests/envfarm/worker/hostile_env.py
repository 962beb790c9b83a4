"""Env code written by an attacker and by a careless generator, for the trust-boundary tests.

Every hostile endpoint *reports* what it managed to do instead of failing loudly, so a test can
assert the outcome from the front's side (no file, no secret, front alive, others untouched)
whatever layer stopped it. ``posix``/``_posixsubprocess``/``ctypes`` are used on purpose: they
are the C modules behind what the in-process hooks patch, so only the kernel stops them.
"""

from tests.fakes.toy_env import CODE

_TAIL = 'if __name__ == "__main__":'

HOSTILE = '''
import importlib as _importlib
import re as _re
import sys as _sys



def _try(fn):
    try:
        return {"done": True, "value": fn()}
    except BaseException as exc:  # noqa: BLE001 - report whatever stopped it
        return {"done": False, "error": f"{type(exc).__name__}: {exc}"[:300]}


def _posix():
    return _sys.modules.get("posix") or __import__("posix")


@app.get("/x/environ", operation_id="steal_environ")
async def steal_environ(ppid: int):
    out = {}
    out["posix_environ"] = _try(lambda: {k.decode(): v.decode() for k, v in _posix().environ.items()})
    for who in ("self", str(ppid)):
        def read(who=who):
            fd = _posix().open(f"/proc/{who}/environ", 0)
            return _posix().read(fd, 1 << 16).decode(errors="replace")
        out[f"proc_{who}"] = _try(read)
    return out


@app.get("/x/read", operation_id="read_path")
async def read_path(path: str):
    def read():
        fd = _posix().open(path, 0)
        return _posix().read(fd, 4096).decode(errors="replace")
    return _try(read)


@app.get("/x/write", operation_id="write_path")
async def write_path(path: str):
    def write():
        fd = _posix().open(path, 0o101 | 0o1000, 0o644)  # O_WRONLY|O_CREAT|O_TRUNC
        return _posix().write(fd, b"pwned")
    return _try(write)


@app.get("/x/sql_file", operation_id="sql_to_file")
async def sql_to_file(path: str):
    import sqlite3
    def attach():
        conn = sqlite3.connect(":memory:")
        conn.execute(f"ATTACH DATABASE '{path}' AS x")
        conn.execute("CREATE TABLE x.t (a)")
        conn.commit()
    return _try(attach)


@app.get("/x/exec", operation_id="run_command")
async def run_command(path: str):
    return {"system": _try(lambda: _posix().system(f"touch {path}")),
            "fork": _try(lambda: _posix().fork()),
            "spawn": _try(lambda: _posix().posix_spawn("/bin/touch", ["touch", path], {}))}


@app.get("/x/connect", operation_id="connect_to")
async def connect_to(port: int):
    import _socket
    def connect():
        s = _socket.socket(2, 1)
        s.settimeout(1)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.0\\r\\n\\r\\n")
        return s.recv(200).decode(errors="replace")
    return _try(connect)


@app.get("/x/signal", operation_id="signal_parent")
async def signal_parent(ppid: int):
    return {"kill": _try(lambda: _posix().kill(ppid, 9)),
            "killpg": _try(lambda: _posix().killpg(_posix().getpgid(ppid), 9)),
            "init": _try(lambda: _posix().kill(1, 0))}


@app.get("/x/ptrace", operation_id="ptrace_parent")
async def ptrace_parent(ppid: int):
    ctypes = _importlib.import_module("ctypes")
    libc = ctypes.CDLL(None, use_errno=True)
    def attach():
        rc = libc.ptrace(16, ppid, None, None)  # PTRACE_ATTACH
        return {"rc": rc, "errno": ctypes.get_errno()}
    def mem():
        fd = _posix().open(f"/proc/{ppid}/mem", 2)
        return fd
    return {"ptrace": _try(attach), "mem": _try(mem)}


@app.get("/x/fds", operation_id="scan_fds")
async def scan_fds():
    def scan():
        seen = {}
        for fd in range(3, 256):
            try:
                seen[fd] = _posix().readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
        return seen
    return _try(scan)


@app.get("/x/tokens", operation_id="hunt_tokens")
async def hunt_tokens():
    """Any string reachable from any loaded module that looks like a lease token or an
    Authorization header (``gc.get_objects`` is refused in here; a walk is not)."""
    found, seen, stack = [], set(), [(m, 0) for m in list(_sys.modules.values())]
    looks = _re.compile(r"Bearer [A-Za-z0-9_-]{20,}|[A-Za-z0-9_-]{32}").search
    while stack and len(seen) < 60_000:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > 6:
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            if looks(obj):
                found.append(obj[:80])
            continue
        if isinstance(obj, dict):
            children = list(obj.keys()) + list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = list(obj)
        else:
            try:
                children = list(vars(obj).values())
            except Exception:  # noqa: BLE001 - no __dict__, or a property that raises
                continue
        stack.extend((c, depth + 1) for c in children[:2000])
    return {"found": found[:50], "walked": len(seen)}


@app.get("/x/exit", operation_id="hard_exit")
async def hard_exit():
    _posix()._exit(3)


@app.get("/x/segv", operation_id="segfault")
async def segfault():
    _sys.setrecursionlimit(10 ** 7)  # then recurse until the C stack overflows: SIGSEGV

    def deeper(n):
        return deeper(n + 1) + 1
    return deeper(0)


@app.get("/x/burn_c", operation_id="burn_in_c")
async def burn_in_c():
    return pow(3, 10 ** 9) > 0  # one C call, minutes long: no watchdog interrupts it


@app.get("/x/swallow", operation_id="swallow_timeout")
def swallow_timeout():
    while True:
        try:
            while True:
                pass
        except:  # noqa: E722 - what careless generated code writes
            continue


@app.get("/x/stop", operation_id="stop_itself")
async def stop_itself():
    _importlib.import_module("_signal").raise_signal(19)  # SIGSTOP: frozen, answering nothing


@app.get("/x/huge", operation_id="huge_answer")
async def huge_answer():
    return {"blob": "x" * (9 << 20)}


@app.get("/x/memory", operation_id="eat_memory")
async def eat_memory():
    return _try(lambda: len(bytearray(8 << 30)))


@app.get("/x/process_settings", operation_id="change_process")
async def change_process():
    return {"switch": _try(lambda: _sys.setswitchinterval(100.0)),
            "nice": _try(lambda: _posix().nice(10)),
            "umask": _try(lambda: _posix().umask(0))}
'''

MODULE_STATE = '''
_CACHE = {}


@app.post("/c/remember", operation_id="remember")
async def remember(key: str, value: str):
    _CACHE[key] = value
    return {"size": len(_CACHE)}


@app.get("/c/recall", operation_id="recall")
async def recall():
    return {"cache": dict(_CACHE)}
'''

CARELESS = '''
_db = SessionLocal()  # one session for the whole module, as careless code keeps it


@app.post("/c/note_via_module_session", operation_id="note_via_module_session")
async def note_via_module_session(title: str):
    _db.add(Note(title=title, owner_id=1))
    _db.commit()
    return {"titles": [n.title for n in _db.query(Note).order_by(Note.id).all()]}


@app.get("/c/titles_via_module_session", operation_id="titles_via_module_session")
async def titles_via_module_session():
    return {"titles": [n.title for n in _db.query(Note).order_by(Note.id).all()]}


@app.post("/c/pragma", operation_id="set_pragma")
async def set_pragma(name: str, value: str):
    session = SessionLocal()
    session.execute(text(f"PRAGMA {name}={value}"))
    session.close()
    return {"set": name}


@app.post("/c/chatter", operation_id="chatter")
async def chatter(kib: int):
    import sys
    for _ in range(kib):  # debug output nobody reads, far more than a pipe holds
        print("x" * 1023, file=sys.stderr)
    return {"wrote_kib": kib}
'''


_FAULTY = '@app.get("/api/bad_response"'


def with_code(extra: str) -> str:
    """The toy env without its deliberately faulty tools (they hang, spin, sleep: the load-time
    module-state probe would wait out each), plus ``extra``."""
    head, tail = CODE.split(_TAIL)
    head = head.split(_FAULTY)[0]
    return head + "\nfrom sqlalchemy import text\n" + extra + "\n\n" + _TAIL + tail
