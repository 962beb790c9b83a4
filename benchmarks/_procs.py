"""Process helpers the benchmarks share."""

from __future__ import annotations

import time


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


def cores_between(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                  seconds: float, top: int = 8) -> list[dict[str, object]]:
    """The busiest processes between two ``cpu_seconds()`` snapshots, in cores."""
    rows = [(after[p][1] - before[p][1]) / seconds for p in after if p in before]
    names = [after[p][0] for p in after if p in before]
    busiest = sorted(zip(rows, names), reverse=True)[:top]
    return [{"cmd": name, "cores": round(cores, 3)} for cores, name in busiest if cores > 0.005]
