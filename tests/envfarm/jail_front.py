"""A stand-in for a trusted front, run as a script by test_jail.py.

It holds a secret (its environment and an open file the child is not given), then for each
attack read from stdin (a JSON list of ``{name, code, policy}``) forks a child that enters the
jail and runs the attack's code. Each child reports on a pipe; the front prints one JSON line
per attack: what the child reported (or how it died), and that the front is still alive.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

from envfarm.confined.jail import JailPolicy, enter


def child(code: str, policy: dict, report_fd: int, secret_fd: int, parent: int) -> None:
    ro_fd = os.open(__file__, os.O_RDONLY)  # a file the child may keep, read-only
    enter(JailPolicy(**policy), keep_fds=(report_fd, ro_fd))
    scope = {"PARENT": parent, "SECRET_FD": secret_fd, "REPORT_FD": report_fd, "RO_FD": ro_fd}
    try:
        exec(code, scope)  # noqa: S102 - the attack under test
        out = {"raised": None, "result": repr(scope.get("result"))[:2000]}
    except BaseException as exc:  # noqa: BLE001 - what it raised is the answer
        out = {"raised": type(exc).__name__, "errno": getattr(exc, "errno", None),
               "message": str(exc)[:500]}
    os.write(report_fd, json.dumps(out).encode())


def run(attack: dict, secret_fd: int) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            child(attack["code"], attack.get("policy", {}), w, secret_fd, os.getppid())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    deadline = time.monotonic() + attack.get("timeout", 10)
    while time.monotonic() < deadline:
        ready, _, _ = select.select([r], [], [], 0.1)
        if ready:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    os.close(r)
    try:
        os.kill(pid, signal.SIGKILL)  # whatever it left running
    except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    return {"name": attack["name"], "child": json.loads(data) if data else None,
            "signal": signal.Signals(sig).name if sig else None, "front_alive": True}


def main() -> None:
    attacks = json.load(sys.stdin)
    secret_fd = os.open(sys.argv[1], os.O_RDONLY)  # open in the front, never passed on
    for attack in attacks:
        print(json.dumps(run(attack, secret_fd)), flush=True)


if __name__ == "__main__":
    main()
