"""What the kernel jail costs: ``enter`` (first layer, a tightening layer in a zygote's child,
and the same layer made beforehand with ``prepare``), and the seccomp filter's price per syscall on a syscall-heavy loop, jailed against not
jailed, in forked children taking turns (so both see the same load).

    python benchmarks/bench_jail.py            # prints one JSON object
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envfarm.jail import JailPolicy, enter, prepare, support

ROUNDS, SYSCALLS = 15, 100_000


def in_child(fn) -> float:
    """Run ``fn`` in a forked child and return the float it reports."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.write(w, repr(fn(w)).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = os.read(r, 100)
    os.close(r)
    os.waitpid(pid, 0)
    return float(data)


def enter_ms(w: int) -> float:
    t = time.perf_counter()
    enter(JailPolicy(), keep_fds=(w,))
    return (time.perf_counter() - t) * 1e3


def tighten_ms(w: int) -> float:
    """A zygote (jailed, may fork) times its child's tightening ``enter``."""
    enter(JailPolicy(processes=True), keep_fds=(w,))
    return in_child(lambda w2: _timed(lambda: enter(
        JailPolicy(processes=False, cpu_s=5, new_session=False), keep_fds=(w2,))))


def prepared_ms(w: int) -> float:
    """The same, with the child's layer made beforehand in the zygote (``prepare``)."""
    enter(JailPolicy(processes=True), keep_fds=(w,))
    prepared = prepare(JailPolicy(processes=False, new_session=False))
    return in_child(lambda w2: _timed(lambda: prepared.enter(keep_fds=(w2,), cpu_s=5)))


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def syscall_ns(jailed: bool):
    def loop(w: int) -> float:
        if jailed:
            enter(JailPolicy(), keep_fds=(w,))
        getppid, fstat = os.getppid, os.fstat
        t = time.perf_counter_ns()
        for _ in range(SYSCALLS):
            getppid()
            fstat(w)
        return (time.perf_counter_ns() - t) / (2 * SYSCALLS)
    return loop


def main() -> None:
    if not support().ok:
        sys.exit(f"kernel lacks confinement: {support().describe()}")
    first, tight, prep, free, jailed = [], [], [], [], []
    for _ in range(ROUNDS):
        first.append(in_child(enter_ms))
        tight.append(in_child(tighten_ms))
        prep.append(in_child(prepared_ms))
        free.append(in_child(syscall_ns(False)))
        jailed.append(in_child(syscall_ns(True)))
    med = statistics.median
    print(json.dumps({
        "kernel": os.uname().release, "support": support().describe(),
        "load_avg_1m": os.getloadavg()[0], "rounds": ROUNDS,
        "enter_ms_p50": round(med(first), 3), "enter_ms_min": round(min(first), 3),
        "tighten_ms_p50": round(med(tight), 3), "tighten_ms_min": round(min(tight), 3),
        "prepared_ms_p50": round(med(prep), 3), "prepared_ms_min": round(min(prep), 3),
        "syscall_ns_p50_free": round(med(free), 1), "syscall_ns_p50_jailed": round(med(jailed), 1),
        "syscall_ratio": round(med(jailed) / med(free), 3),
    }, indent=1))


if __name__ == "__main__":
    main()
