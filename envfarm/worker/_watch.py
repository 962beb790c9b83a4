"""The front's CPU watch over env workers: code no call asked for does not get to run.

A call's code may use the CPU while the call is in flight; a thread it left behind (started
around the guard, spinning after its lease was released) burns CPU when nothing is asked of
the worker. Every ``interval_s`` the watch reads each worker's CPU time (``/proc/<pid>/stat``,
all its threads) and the wall time it had a request in flight, and kills a worker that burnt
more than ``idle_share`` of a core while idle plus ``busy_share`` while busy: a per-call budget
proportional to each call's wall time. It also kills a worker that left a request whose caller
went away unanswered past its deadline (no caller's deadline watches that one). The worker's
leases then move on (``RemoteInstance``): none of them had a call in flight that can be blamed.
"""

from __future__ import annotations

import time

from envfarm.worker._process import WorkerProcess


class CpuWatch:
    """Per-worker CPU marks and the rule they are judged by."""

    def __init__(self, idle_share: float, busy_share: float, slack_s: float = 0.2) -> None:
        self.idle_share = idle_share
        self.busy_share = busy_share
        self.slack_s = slack_s  # a collector pass, a burst of drops: not a runaway
        self._marks: dict[int, tuple[float, float, float]] = {}  # pid -> (cpu, busy, when)

    def look(self, workers: list[WorkerProcess]) -> None:
        """Judge each attached worker's CPU since the last look; kill runaways."""
        seen = set()
        for worker in workers:
            if worker.lost is not None:
                continue
            seen.add(worker.pid)
            why = self._runaway(worker)
            if why is not None:
                worker.kill(why)
        for pid in set(self._marks) - seen:
            del self._marks[pid]

    def _runaway(self, worker: WorkerProcess) -> str | None:
        if worker.overdue():
            return "left a request past its deadline unanswered (its caller went away)"
        cpu, busy, now = worker.cpu_seconds(), worker.busy_seconds(), time.monotonic()
        if cpu is None:
            return None
        mark = self._marks.get(worker.pid)
        self._marks[worker.pid] = (cpu, busy, now)
        if mark is None:
            return None
        burnt, busy_s, wall = cpu - mark[0], busy - mark[1], now - mark[2]
        allowed = self.idle_share * (wall - busy_s) + self.busy_share * busy_s + self.slack_s
        if burnt <= allowed:
            return None
        return (f"burnt {burnt:.2f} CPU-s in {wall:.2f} s with a request in flight for "
                f"{busy_s:.2f} s of it (allowed {allowed:.2f}): code no call asked for runs "
                "there")
