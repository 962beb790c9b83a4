"""What the kernel jail costs: ``enter`` (first layer, a tightening layer in a zygote's child,
and the same layer made beforehand with ``prepare``), and the seccomp filter's price per syscall
on syscall-heavy loops (getppid + fstat; isatty, an ioctl through the filter's allow list),
jailed against not jailed, in forked children taking turns (so both see the same load).

As root it also starts env workers (spawn, imports, jail, the env's code loaded) with and without
the switch to a uid of their own (issue 34), taking turns: seconds to start and PSS/RSS after.

    python benchmarks/boundary/bench_jail.py                 # prints one JSON object
    python benchmarks/boundary/bench_jail.py --no-workers    # the syscall part only
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envfarm.jail import JailPolicy, enter, prepare, support

ROUNDS, SYSCALLS = 15, 100_000
WORKER_ROUNDS = 8


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


def syscall_ns(jailed: bool, ioctl: bool = False):
    def loop(w: int) -> float:
        if jailed:
            enter(JailPolicy(), keep_fds=(w,))
        getppid, fstat, isatty = os.getppid, os.fstat, os.isatty
        t = time.perf_counter_ns()
        if ioctl:
            for _ in range(SYSCALLS):
                isatty(w)
            return (time.perf_counter_ns() - t) / SYSCALLS
        for _ in range(SYSCALLS):
            getppid()
            fstat(w)
        return (time.perf_counter_ns() - t) / (2 * SYSCALLS)
    return loop


LAZY = ("colorsys", "fractions", "statistics", "csv", "xml.dom.minidom", "email.mime.text",
        "lzma", "bz2", "difflib", "pprint")


def lazy_import_ms(switch_uid: bool):
    """Importing modules not loaded before the jail (as env code does in a handler): directly
    as root, or, after the switch to a uid of its own, through the pinned folders."""
    def run(w: int) -> float:
        from envfarm.jail import worker_identity, uid_from_config

        uid = uid_from_config(worker_identity().config()) if switch_uid else None
        enter(JailPolicy(uid=uid, keep_imports=True), keep_fds=(w,))
        return _timed(lambda: [__import__(name) for name in LAZY])
    return run


def _memory_mib(pid: int) -> tuple[float, float]:
    """(PSS, RSS) of a process, MiB."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name in ("Pss", "Rss"):
                fields[name] = int(rest.split()[0]) / 1024
    return round(fields["Pss"], 1), round(fields["Rss"], 1)


def worker_start(switch_uid: bool) -> dict:
    """Spawn an env worker and load an env in it, as a farm does; seconds and memory after."""
    from benchmarks.serve.bench_dataplane import ENV
    from envfarm.catalog import load_catalog
    from envfarm.jail import worker_identity
    from envfarm.worker import WorkerProcess

    bundle = load_catalog()[ENV]
    load = {"op": "load", "bundle": bundle.model_dump(
                mode="json", include={"name", "code", "db_schema", "sample_data", "api_spec"}),
            "call_timeout_s": 10.0, "max_payload_bytes": 1 << 20, "foreign_keys": False,
            "probe_module_state": False}
    identity = worker_identity().config() if switch_uid else {}
    t = time.perf_counter()
    worker = WorkerProcess({"jail": True, "memory_mb": 2048, **identity})
    worker.start(load, 60.0)
    seconds = time.perf_counter() - t
    pss, rss = _memory_mib(worker.pid)
    jail = worker.jail
    worker.kill("benchmark done")
    return {"s": seconds, "pss": pss, "rss": rss, "jail": jail}


def workers(rounds: int = WORKER_ROUNDS) -> dict:
    """Worker start and memory, staying root against switching uid, taking turns."""
    runs = {False: [], True: []}
    for _ in range(rounds):
        for switch in (False, True):
            runs[switch].append(worker_start(switch))
    med = statistics.median
    out = {}
    for switch, name in ((False, "root"), (True, "own_uid")):
        rows = runs[switch]
        out[name] = {"start_s_p50": round(med(r["s"] for r in rows), 3),
                     "start_s_min": round(min(r["s"] for r in rows), 3),
                     "pss_mib_p50": med(r["pss"] for r in rows),
                     "rss_mib_p50": med(r["rss"] for r in rows), "jail": rows[-1]["jail"]}
    out["start_ratio"] = round(out["own_uid"]["start_s_p50"] / out["root"]["start_s_p50"], 3)
    return out


def main() -> None:
    if not support().ok:
        sys.exit(f"kernel lacks confinement: {support().describe()}")
    first, tight, prep, free, jailed, ioctl_free, ioctl_jailed = [], [], [], [], [], [], []
    lazy_root, lazy_own = [], []
    for _ in range(ROUNDS):
        if os.geteuid() == 0:
            lazy_root.append(in_child(lazy_import_ms(False)))
            lazy_own.append(in_child(lazy_import_ms(True)))
        first.append(in_child(enter_ms))
        tight.append(in_child(tighten_ms))
        prep.append(in_child(prepared_ms))
        free.append(in_child(syscall_ns(False)))
        jailed.append(in_child(syscall_ns(True)))
        ioctl_free.append(in_child(syscall_ns(False, ioctl=True)))
        ioctl_jailed.append(in_child(syscall_ns(True, ioctl=True)))
    med = statistics.median
    print(json.dumps({
        "kernel": os.uname().release, "support": support().describe(),
        "load_avg_1m": os.getloadavg()[0], "rounds": ROUNDS,
        "enter_ms_p50": round(med(first), 3), "enter_ms_min": round(min(first), 3),
        "tighten_ms_p50": round(med(tight), 3), "tighten_ms_min": round(min(tight), 3),
        "prepared_ms_p50": round(med(prep), 3), "prepared_ms_min": round(min(prep), 3),
        "syscall_ns_p50_free": round(med(free), 1), "syscall_ns_p50_jailed": round(med(jailed), 1),
        "syscall_ratio": round(med(jailed) / med(free), 3),
        "ioctl_ns_p50_free": round(med(ioctl_free), 1),
        "ioctl_ns_p50_jailed": round(med(ioctl_jailed), 1),
        "ioctl_ratio": round(med(ioctl_jailed) / med(ioctl_free), 3),
        "lazy_imports_ms_p50_root": round(med(lazy_root), 2) if lazy_root else None,
        "lazy_imports_ms_p50_own_uid": round(med(lazy_own), 2) if lazy_own else None,
        "workers": ("skipped" if "--no-workers" in sys.argv[1:] else workers()
                    if os.geteuid() == 0 else "not root: workers keep the farm's uid"),
        "load_avg_1m_end": os.getloadavg()[0],
    }, indent=1))


if __name__ == "__main__":
    main()
