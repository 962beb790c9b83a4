"""RSS of the farm's processes over time, grouped by role, with a linear slope per group."""

from __future__ import annotations

import os
import time

import psutil

GROUPS = ("raylet", "gcs", "controller", "pool_replicas", "door_front_proxy", "haproxy",
          "ray_other", "client")


def _role(proc: psutil.Process, cmdline: str) -> str | None:
    name = proc.name()
    if "haproxy" in name:
        return "haproxy"
    if name == "raylet" or "/raylet" in cmdline.split(" ")[0]:
        return "raylet"
    if "gcs_server" in name or "gcs_server" in cmdline.split(" ")[0]:
        return "gcs"
    if "ServeController" in cmdline:
        return "controller"
    if "ServeReplica" in cmdline and ":pool" in cmdline:
        return "pool_replicas"
    if "ServeReplica" in cmdline or "ProxyActor" in cmdline:
        return "door_front_proxy"
    if cmdline.startswith("ray::") or "default_worker.py" in cmdline:
        return "ray_other"
    return None


def _in_session(proc: psutil.Process, cmdline: str, session: str) -> bool:
    """Whether the process belongs to this Ray session (other Ray sessions may run here)."""
    if session in cmdline:
        return True
    try:
        return any(session in " ".join(p.cmdline()) for p in proc.parents())
    except psutil.Error:
        return False


def sample_rss(session: str) -> dict[str, float]:
    """MiB of resident memory per group right now (sum over the group's processes)."""
    out = dict.fromkeys(GROUPS, 0.0)
    out["client"] = psutil.Process(os.getpid()).memory_info().rss / 2**20
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            cmdline = " ".join(proc.cmdline())
            role = _role(proc, cmdline)
            if role is None or not _in_session(proc, cmdline, session):
                continue
            out[role] += proc.memory_info().rss / 2**20
        except psutil.Error:
            continue
    return {k: round(v, 1) for k, v in out.items()}


def slope_per_min(times_s: list[float], values: list[float]) -> float | None:
    """Least-squares slope, MiB per minute (None with fewer than 3 samples)."""
    n = len(times_s)
    if n < 3:
        return None
    mt, mv = sum(times_s) / n, sum(values) / n
    var = sum((t - mt) ** 2 for t in times_s)
    if var == 0:
        return None
    cov = sum((t - mt) * (v - mv) for t, v in zip(times_s, values))
    return round(cov / var * 60, 3)


class RssLog:
    """RSS samples per group over the run."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.t0 = time.monotonic()
        self.times: list[float] = []
        self.samples: list[dict[str, float]] = []

    def sample(self) -> None:
        self.samples.append(sample_rss(self.session))
        self.times.append(round(time.monotonic() - self.t0, 1))

    def report(self, kill_at_s: float | None) -> dict:
        """Per group: first/last/max MiB and slopes: whole run, before and after the kill (the
        killed replica's replacement starts small and grows back), and over the last 120 s of
        each phase (after warm-up: growth there is what a longer run would keep)."""
        end = self.times[-1] if self.times else 0.0
        windows = {"whole": (0.0, end)}
        if kill_at_s is not None:
            windows |= {"before_kill": (0.0, kill_at_s), "after_kill_30s": (kill_at_s + 30, end),
                        "last_120s_before_kill": (kill_at_s - 120, kill_at_s)}
        windows["last_120s"] = (end - 120, end)
        out = {}
        for g in GROUPS:
            vals = [s[g] for s in self.samples]
            if not vals:
                continue
            entry = {"first_mib": vals[0], "last_mib": vals[-1], "max_mib": max(vals)}
            for label, (lo, hi) in windows.items():
                pts = [(t, v) for t, v in zip(self.times, vals) if lo <= t < hi or t == end == hi]
                entry[f"slope_{label}_mib_per_min"] = slope_per_min(
                    [t for t, _ in pts], [v for _, v in pts])
            out[g] = entry
        return out
