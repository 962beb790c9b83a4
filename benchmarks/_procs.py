"""Process helpers the benchmarks share."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_http(url: str, timeout_s: float = 120.0) -> None:
    """Until ``url`` answers below 500 (a farm or server that is up), or RuntimeError."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def cpu_seconds() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of every process now: pid -> (short command, seconds)."""
    import psutil

    out = {}
    for proc in psutil.process_iter():
        try:
            cmd = " ".join(proc.cmdline())[:80] or proc.name()
            t = proc.cpu_times()
            out[proc.pid] = (cmd, t.user + t.system)
        except psutil.Error:
            continue
    return out


def cores_while(run: Callable[[], T], seconds: float) -> tuple[T, dict[int, tuple[str, float]]]:
    """``run()`` (lasting about ``seconds``) in a thread, and every process's CPU in cores over
    all but its first and last second: pid -> (short command, cores)."""
    out: list[T] = []
    worker = threading.Thread(target=lambda: out.append(run()))
    worker.start()
    time.sleep(1)
    before, t0 = cpu_seconds(), time.perf_counter()
    time.sleep(max(0.5, seconds - 2))
    after, dt = cpu_seconds(), time.perf_counter() - t0
    worker.join()
    return out[0], {pid: (cmd, (cpu - before[pid][1]) / dt)
                    for pid, (cmd, cpu) in after.items() if pid in before}


def ray_group(cmd: str, name: str) -> str:
    """A Serve farm's process by what it does (Serve's replicas by deployment)."""
    if "haproxy" in name:
        return "haproxy"
    if "ServeReplica" in cmd:
        return ("door" if ":door" in cmd else "front" if ":front" in cmd
                else "pool replicas")
    for key, group in (("ProxyActor", "proxy"), ("ServeController", "controller"),
                       ("raylet", "raylet"), ("gcs_server", "gcs")):
        if key in cmd or key in name:
            return group
    return "ray other"
