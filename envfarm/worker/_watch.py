"""The front's CPU watch over env workers: code no call asked for does not get to run.

A call's code may use the CPU while the call is in flight; a thread it left behind (started
around the guard, spinning after its lease was released) burns CPU when nothing is asked of
the worker. At each look the watch reads how long each worker's threads were runnable (on a
CPU or waiting in the run queue: ``/proc/<pid>/task/*/schedstat``; a thread spinning on a
contended host gets a fraction of a core but is runnable all the time) and the wall time it
had a request in flight. It may be runnable ``idle_share`` of the time while idle and
``busy_share`` while busy (a per-call budget proportional to each call's wall time). What it
uses beyond that fills a bucket that what it leaves unused empties: a worker whose bucket
passes ``burst_s`` seconds is killed (a spinning thread within a second or two; a collector
pass never). It also kills a worker that left a request whose caller
went away unanswered past its deadline (no caller's deadline watches that one). The worker's
leases then move on (``RemoteInstance``): none of them had a call in flight that can be blamed.
"""

from __future__ import annotations

import time

from envfarm.worker._process import WorkerProcess


class CpuWatch:
    """Per-worker CPU marks and the rule they are judged by."""

    def __init__(self, idle_share: float, busy_share: float, burst_s: float = 0.5) -> None:
        self.idle_share = idle_share
        self.busy_share = busy_share
        self.burst_s = burst_s
        #: pid -> (cpu, busy, when) at the last look, and the CPU-seconds over the allowance
        self._marks: dict[int, tuple[float, float, float, float]] = {}

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
        if mark is None:
            self._marks[worker.pid] = (cpu, busy, now, 0.0)
            return None
        burnt, busy_s, wall = cpu - mark[0], busy - mark[1], now - mark[2]
        allowed = self.idle_share * (wall - busy_s) + self.busy_share * busy_s
        over = max(0.0, mark[3] + burnt - allowed)
        self._marks[worker.pid] = (cpu, busy, now, over)
        if over <= self.burst_s:
            return None
        return (f"was runnable {burnt:.2f} s of {wall:.2f} s with a request in flight for "
                f"{busy_s:.2f} s of it ({over:.2f} s over its allowance by now): code no call "
                "asked for runs there")
