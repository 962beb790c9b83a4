"""The front's CPU watch over env workers: code no call asked for does not get to run.

A call's code may use the CPU while the call is in flight; a thread it left behind (started
around the guard, spinning after its lease was released) burns CPU when nothing is asked of
the worker. At each look the watch reads how long each worker's threads were runnable (on a
CPU or waiting in the run queue: ``/proc/<pid>/task/*/schedstat``; a thread spinning on a
contended host gets a fraction of a core but is runnable all the time) and the wall time it
had a request in flight. It may be runnable ``idle_share`` of the time while idle and
``busy_share`` while busy (a per-call budget proportional to each call's wall time). What it
uses beyond that fills a bucket that what it leaves unused empties: a worker whose bucket
passes ``burst_s`` seconds is killed (a spinning thread within two or three looks; a collector
pass never). A worker whose CPU time barely moved since the last look costs one read
(``/proc/<pid>/stat``), not one per thread. The watch also kills a worker that left a request
whose caller went away unanswered past its deadline (no caller's deadline watches that one).
A killed worker's leases move on (``RemoteInstance``): no call of theirs can be blamed.
"""

from __future__ import annotations

import time

from envfarm.worker._process import WorkerProcess

#: CPU share below which a worker is quiet: its runnable time is not read (a spinner, however
#: starved, gets more than this on any host worth serving from).
_QUIET_SHARE = 0.02


class _Mark:
    """What the watch saw of one worker: at the last look (CPU), and at the last look that read
    its runnable time (None: none since it was quiet), with the seconds over its allowance."""

    __slots__ = ("cpu", "when", "runnable", "busy", "runnable_when", "over")

    def __init__(self, cpu: float, when: float) -> None:
        self.cpu, self.when = cpu, when
        self.runnable: float | None = None
        self.busy = self.runnable_when = self.over = 0.0


class CpuWatch:
    """Per-worker marks and the rule they are judged by."""

    def __init__(self, idle_share: float, busy_share: float, burst_s: float = 0.5) -> None:
        self.idle_share = idle_share
        self.busy_share = busy_share
        self.burst_s = burst_s
        self._marks: dict[int, _Mark] = {}

    def look(self, workers: list[WorkerProcess]) -> None:
        """Judge each attached worker since the last look; kill runaways."""
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
        cpu, now = worker.cpu_seconds(), time.monotonic()
        if cpu is None:
            return None
        mark = self._marks.get(worker.pid)
        if mark is None:
            self._marks[worker.pid] = _Mark(cpu, now)
            return None
        quiet = cpu - mark.cpu <= _QUIET_SHARE * (now - mark.when) and not mark.over
        mark.cpu, mark.when = cpu, now
        if quiet:
            mark.runnable = None  # the next busy look starts a new span
            return None
        runnable, busy = worker.runnable_seconds(), worker.busy_seconds()
        if runnable is None:  # no schedstat here: CPU time is the best there is
            runnable = cpu
        if mark.runnable is None:
            mark.runnable, mark.busy, mark.runnable_when = runnable, busy, now
            return None
        used, busy_s = runnable - mark.runnable, busy - mark.busy
        wall = now - mark.runnable_when
        allowed = self.idle_share * (wall - busy_s) + self.busy_share * busy_s
        mark.over = max(0.0, mark.over + used - allowed)
        mark.runnable, mark.busy, mark.runnable_when = runnable, busy, now
        if mark.over <= self.burst_s:
            return None
        return (f"was runnable {used:.2f} s of {wall:.2f} s with a request in flight for "
                f"{busy_s:.2f} s of it ({mark.over:.2f} s over its allowance by now): code no "
                "call asked for runs there")
