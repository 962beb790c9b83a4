"""The verifier zygote: every verification runs in a fresh, confined process it forks.

Started by ``judge.sandbox.VerifierSandbox`` as ``python -I -S -B _sandbox_worker.py CONFIG``
with one end of a SOCK_SEQPACKET socket pair as its control channel. It loads the standard-library
modules verifiers may use, ``_sandbox_harness`` (what a child runs, beside this file) and
``envfarm.confined.jail`` (nothing else of the project; the front compiled its seccomp filters),
and enters the kernel jail (it may fork, nothing else), switching to an unprivileged uid of its
own when started as root. Per verification the front sends two pipe ends (SCM_RIGHTS): the
request to read, the reply to write, and, with Landlock, a ruleset descriptor (the zygote's
readable roots and this verification's two databases, made by the front). The zygote forks a
child (``_sandbox_harness._verify_once``), tells the front its pid (killed at the deadline) and,
later, how it ended; it never reads a request. On the control socket, one message per datagram:
the zygote's JSON hello, then ``JOB`` and ``NOTE`` structs.
"""

from __future__ import annotations

import _socket  # not socket: its enums, selectors, select and array, in every child's image
import base64
import gc
import json
import marshal
import os
import signal
import struct
import sys
import time

#: Control datagrams after the zygote's JSON hello: a job (its id and CPU limit, with the
#: request pipe's read end and the reply pipe's write end), and notes on a job's child.
JOB = struct.Struct("!Id")
NOTE = struct.Struct("!BIq")  # STARTED with the child's pid, ENDED with its wait status
STARTED, ENDED = 1, 2


def _preload(harness) -> None:
    """Import what verifiers may use, once, here: a child importing it would pay each time."""
    # random reseeds itself in every child after a fork (~0.1 ms, ~40 page faults each): not
    # here; a child reseeds it only when its verifier imports it (see _safe_builtins).
    register, os.register_at_fork = os.register_at_fork, lambda **_: None
    try:
        for name in sorted(harness.ALLOWED_IMPORTS | harness._LAZY_OK):
            __import__(name)
    finally:
        os.register_at_fork = register
    time.strptime("2024-01-01", "%Y-%m-%d")  # warms _strptime's lazy state
    "x".encode("latin-1").decode("ascii")


def _warm_up(harness, read_root: str) -> None:
    """Here, what each child does: SQLite's global set-up (VFSes, ~200 built-in functions) at
    a process's first connection, the hardened connection's first-use state, and the
    harness's own steps, run until CPython has specialized their bytecode (a child that
    specializes it writes to, and so copies, the pages it lives on). Trusted code on data of
    its own; the call state is reset after."""
    conn = harness.sqlite3.connect(":memory:", factory=harness._LockedConnection, uri=False)
    conn.execute("CREATE TABLE t (x INTEGER, y TEXT)")
    conn.execute("SELECT x, upper(y) FROM t WHERE x = ? ORDER BY y", (1,)).fetchall()
    conn.close()
    code = compile("def verify(a, b, answer):\n    import json, sqlite3\n"
                   "    sqlite3.connect(':memory:').close()\n"
                   "    return {'result': 'complete', 'n': json.loads('[1, 2.5, null]')}\n",
                   "<warm-up>", "exec")
    fields = {"func": "verify", "mode": "code", "takes_answer": True, "initial": "/i",
              "final": "/f", "initial_uri": "file:/i", "final_uri": "file:/f",
              "final_answer": None}
    head, body = marshal.dumps(fields), marshal.dumps(code)
    frame = struct.pack("!II", len(head), len(body)) + head + body
    read_end, write_end = os.pipe()
    try:
        for _ in range(16):  # CPython 3.11 specializes a function after 8 calls
            os.write(write_end, frame)
            req, compiled = harness._recv(read_end)
            for event, args in (("open", (read_root + "x", "r", 0)), ("import", ("json",)),
                                ("sqlite3.connect", (":memory:",)), ("compile", (None, ""))):
                harness._HOOK(event, args)
            harness._send(write_end, harness._run_one(req, compiled, harness._STATE,
                                                      harness._BUILTINS, 1 << 20))
            os.read(read_end, 1 << 16)
    finally:
        os.close(read_end)
        os.close(write_end)
    harness._STATE.__init__()


def _confine(harness, jail, config: dict, ctl: _socket.socket):
    """Enter the zygote's jail and make its children's; None (reported) if it cannot."""
    filters = {k: base64.b64decode(v) for k, v in (config.get("seccomp") or {}).items()}
    try:
        # Everything is loaded: started as root, it switches to a uid of its own in there, and
        # from then on nothing can read (or change) what only root may.
        fields = config["policies"]["zygote"]
        zygote = jail.JailPolicy(**{**fields, "read_paths": tuple(fields["read_paths"])},
                                 uid=jail.uid_from_config(config))
        have = jail.enter(zygote, keep_fds=(0, 1, 2, ctl.fileno()),
                          compiled=filters.get("zygote"))
    except jail.JailError as exc:
        ctl.send(json.dumps({"ready": False, "error": str(exc)}).encode())
        return None
    # Without the staging folder: the front grants each child its two databases, in the
    # Landlock ruleset it makes from these (see _verify_once).
    config["roots"] = jail.readable_roots()
    config["read_roots"] = tuple(os.path.join(p, "") for p in config["roots"])
    # Made once here for every child (which starts from a pristine copy: no verifier runs
    # here): the layer it enters (its Landlock layer comes with its job), the call state,
    # builtins and sqlite3 connection class a verifier gets.
    prepared = jail.prepare(jail.JailPolicy(**config["policies"]["child"]),
                            compiled=filters.get("child"), landlock=False)
    harness._STATE = state = harness._CallState()
    harness._LockedConnection = harness._locked_connection_class(state)
    harness._BUILTINS = harness._safe_builtins(state, harness._private_copies(state))
    harness._HOOK = harness._make_hook(state, config["read_roots"])
    _warm_up(harness, config["read_roots"][0])
    return have, prepared


def _zygote(config: dict) -> None:
    sys.path[:0] = config["sys_path"]  # only so envfarm.confined.jail loads
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # and, last, the harness
    import _sandbox_harness as harness

    from envfarm.confined import jail

    ctl = _socket.socket(fileno=config["ctl_fd"])  # wraps the inherited fd: no socket() call
    _preload(harness)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    confined = _confine(harness, jail, config, ctl)
    if confined is None:
        return
    have, prepared = confined
    gc.freeze()  # what is loaded now stays out of every collection, in here and in children
    gc.disable()  # and none runs here: it would write to (and so copy) pages children share
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # set by _serve; none may end before
    # With Landlock, each job brings the ruleset its child stacks: a job without one is refused.
    ctl.send(json.dumps({"ready": True, "pid": os.getpid(), "jail": have.describe(),
                         "roots": config["roots"] if have.landlock_abi else None}).encode())
    _serve(ctl, 3 if have.landlock_abi else 2,
           lambda fds, cpu_s: harness._verify_once(prepared, fds, cpu_s, config))


def _serve(ctl: _socket.socket, nfds: int, verify) -> None:
    """Fork a child per job; say when each started and, when reaped, how it ended. Little
    Python per job: whatever this process touches after a fork, it copies (children share
    every page until then)."""
    jobs: dict[int, int] = {}  # child pid -> job id
    ended: dict[int, int] = {}  # reaped before its job was recorded: pid -> status

    def reap(*_) -> None:  # SIGCHLD: runs between two bytecodes of the loop below
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = jobs.pop(pid, None)
            if job is None:
                ended[pid] = status
            else:
                ctl.send(NOTE.pack(ENDED, job, status))

    signal.signal(signal.SIGCHLD, reap)
    ancillary = _socket.CMSG_LEN(4 * nfds)
    while True:
        msg, anc, _, _ = ctl.recvmsg(JOB.size, ancillary)
        if not msg:
            return  # the front is gone; the children die with us
        fds = [fd for level, kind, data in anc if level == _socket.SOL_SOCKET
               and kind == _socket.SCM_RIGHTS for fd in struct.unpack(f"{len(data) // 4}i", data)]
        if len(msg) != JOB.size or len(fds) != nfds:
            for fd in fds:
                os.close(fd)
            continue
        job, cpu_s = JOB.unpack(msg)
        pid = os.fork()
        if pid == 0:
            try:
                verify(fds, cpu_s)
            finally:
                os._exit(0)
        jobs[pid] = job
        status = ended.pop(pid, None)  # it ended, and was reaped, before the line above
        for fd in fds:
            os.close(fd)
        ctl.send(NOTE.pack(STARTED, job, pid))
        if status is not None and jobs.pop(pid, None) is not None:
            ctl.send(NOTE.pack(ENDED, job, status))


if __name__ == "__main__":
    _zygote(json.loads(sys.argv[1]))
