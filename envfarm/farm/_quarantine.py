"""Quarantine while serving: a task that keeps failing on the env's side, or that the catalog
flagged at load, takes no new lease until an operator lifts it.

Counted per (env, task) and per env type over the last ``window_s`` seconds, in one bucket per
second: tool calls (an ``env_error`` answer or a lease lost with its worker is bad) and
verifications (``invalid`` or ``environment_error`` is bad). A task, or a whole env type, is
quarantined once one of its counts has at least ``min_calls`` / ``min_verifications`` events in
the window and the bad share is over ``max_env_error_share`` / ``max_invalid_share``. The env
type's counts are its leases' without a task plus its tasks' up to the event that quarantined
a task: one bad task is that task's fault; two, or task-less leases failing, the env's. A task the
catalog flagged (``EnvBundle.flagged``: a hack probe passes its verifier) is quarantined at load.
New leases for a quarantined task (any task of a quarantined env type) get ``TaskQuarantined``
saying why; leases already out finish their episodes. Lifting resets the task's counts.

Per process, like quotas: each Serve replica counts the leases it owns; the status page and
``/quarantine`` on the front merge the replicas' lists. The hot path is a few dict updates.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator

from fastapi import Depends, FastAPI, Request
from fastapi.security import APIKeyHeader
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field

from envfarm.errors import TaskQuarantined
from envfarm.farm._tenants import KEY_HEADER
from envfarm.wire import ErrorBody, LiftRequest, QuarantinedTask

#: (env, task_idx); task_idx None is the env type as a whole
Key = tuple[str, int | None]


class QuarantineConfig(BaseModel):
    """When a farm takes a task out of rotation (defaults defined here only)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="Count and quarantine at all.")
    window_s: float = Field(default=600.0, gt=0, le=86_400, description="Seconds counted.")
    min_calls: int = Field(default=20, ge=1, description="Tool calls needed in the window "
                                                         "before their env-error share is judged.")
    max_env_error_share: float = Field(default=0.5, ge=0, le=1, description=(
        "Quarantine when more than this share of the window's tool calls failed on the env's "
        "side (env_error, lease lost)."))
    min_verifications: int = Field(default=5, ge=1, description="Verifications needed in the "
                                                                "window before their share is judged.")
    max_invalid_share: float = Field(default=0.5, ge=0, le=1, description=(
        "Quarantine when more than this share of the window's verifications had no verdict on "
        "the agent (invalid, environment_error)."))
    flagged: bool = Field(default=True, description=(
        "Quarantine at load the tasks the catalog flags (a hack probe passes their verifier)."))


class _Counts:
    """Per-second buckets of (calls, bad calls, verifications, bad verifications), and sums."""

    __slots__ = ("buckets", "sums")

    def __init__(self) -> None:
        self.buckets: deque[list[int]] = deque()  # [second, calls, bad, verifications, bad]
        self.sums = [0, 0, 0, 0]

    def add(self, second: int, window: int, slot: int, bad: bool) -> None:
        buckets, sums = self.buckets, self.sums
        if not buckets or buckets[-1][0] != second:  # a new second: old ones may leave the window
            buckets.append([second, 0, 0, 0, 0])
            while buckets[0][0] <= second - window:
                old = buckets.popleft()
                for i in range(4):
                    sums[i] -= old[i + 1]
        bucket = buckets[-1]
        bucket[slot + 1] += 1
        sums[slot] += 1
        if bad:
            bucket[slot + 2] += 1
            sums[slot + 1] += 1


class Quarantine:
    """The quarantined tasks of one farm process, and the counts that put them there."""

    def __init__(self, config: QuarantineConfig, owner: str,
                 flagged: dict[str, dict[int, str]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.owner, self._clock = config, owner, clock
        self._on, self._window = config.enabled, max(1, int(config.window_s))  # read per call
        self._counts: dict[Key, _Counts] = {}
        self.entries: dict[Key, QuarantinedTask] = {}
        self.events = {"quarantined": 0, "lifted": 0, "refused": 0}
        if config.enabled and config.flagged:
            for env, tasks in (flagged or {}).items():
                for idx, why in sorted(tasks.items()):
                    self._put((env, idx), f"flagged at load: {why}", "flagged")

    # -- the lease path -------------------------------------------------------------------------
    def admit(self, env: str, task_idx: int | None) -> None:
        """Raise ``TaskQuarantined`` for a new lease of a quarantined task or env type."""
        if not self.entries:
            return
        entry = self.entries.get((env, None)) or (
            self.entries.get((env, task_idx)) if task_idx is not None else None)
        if entry is not None:
            self.events["refused"] += 1
            what = f"env {env!r}" if entry.task_idx is None else f"task {entry.task_idx} of env {env!r}"
            raise TaskQuarantined(f"{what} is quarantined: {entry.reason}; an operator lifts it "
                                  "(envfarm envs quarantine lift)", env=env, task_idx=entry.task_idx,
                                  reason=entry.reason, source=entry.source)

    def record_call(self, env: str, task_idx: int | None, bad: bool) -> None:
        self._record(env, task_idx, 0, bad)

    def record_verification(self, env: str, task_idx: int | None, bad: bool) -> None:
        self._record(env, task_idx, 2, bad)

    def _record(self, env: str, task_idx: int | None, slot: int, bad: bool) -> None:
        if not self._on:
            return
        second, window = int(self._clock()), self._window
        if task_idx is not None:
            key: Key = (env, task_idx)
            if key in self.entries:
                return  # out of rotation: its last episodes count for neither it nor its env
            self._add(key, second, window, slot, bad)
            if key in self.entries:
                return  # quarantined by this event: the task's fault, not yet the env type's
        self._add((env, None), second, window, slot, bad)

    def _add(self, key: Key, second: int, window: int, slot: int, bad: bool) -> None:
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = _Counts()
        counts.add(second, window, slot, bad)
        if bad and key not in self.entries:
            self._judge(key, counts)

    def _judge(self, key: Key, counts: _Counts) -> None:
        calls, bad_calls, verifs, bad_verifs = counts.sums
        cfg = self.config
        why = None
        if calls >= cfg.min_calls and bad_calls / calls > cfg.max_env_error_share:
            why = f"{bad_calls} of {calls} tool calls failed on the env's side"
        elif verifs >= cfg.min_verifications and bad_verifs / verifs > cfg.max_invalid_share:
            why = f"{bad_verifs} of {verifs} verifications gave no verdict (invalid or env error)"
        if why:
            self._put(key, f"{why} in the last {cfg.window_s:g} s", "errors")

    def _put(self, key: Key, reason: str, source: str) -> None:
        self.entries[key] = QuarantinedTask(env=key[0], task_idx=key[1], reason=reason, source=source,
                                            since=time.time(), owners=[self.owner])
        self.events["quarantined"] += 1

    # -- operators ------------------------------------------------------------------------------
    def listing(self) -> list[QuarantinedTask]:
        return [self.entries[k] for k in sorted(self.entries, key=lambda k: (k[0], -1 if k[1] is None else k[1]))]

    def lift(self, env: str, task_idx: int | None = None) -> list[QuarantinedTask]:
        """Put a task back (``task_idx`` None: the env type and every task of it); its counts
        start again from zero. Returns what was lifted."""
        keys = [k for k in self.entries if k[0] == env and (task_idx is None or k[1] == task_idx)]
        lifted = [self.entries.pop(k) for k in keys]
        for key in list(self._counts):
            if key[0] == env and (task_idx is None or key[1] in (task_idx, None)):
                del self._counts[key]
        self.events["lifted"] += len(lifted)
        return lifted


def merge_quarantine(lists: list[list[QuarantinedTask]]) -> list[QuarantinedTask]:
    """One list from several replicas': a task once, with every owner that quarantined it."""
    merged: dict[Key, QuarantinedTask] = {}
    for entries in lists:
        for e in entries:
            key = (e.env, e.task_idx)
            if key in merged:
                merged[key].owners = sorted(set(merged[key].owners) | set(e.owners))
                merged[key].since = min(merged[key].since, e.since)
            else:
                merged[key] = e.model_copy(deep=True)
    return [merged[k] for k in sorted(merged, key=lambda k: (k[0], -1 if k[1] is None else k[1]))]


class QuarantineCollector(Collector):
    """``envfarm_quarantined{scope}`` (tasks, and whole env types, out of rotation: which ones is
    on /quarantine) and ``envfarm_quarantine_events_total{event}``, read at scrape time."""

    def __init__(self, owner: str, quarantine: Quarantine) -> None:
        self.owner, self.quarantine = owner, quarantine

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gauge = GaugeMetricFamily("envfarm_quarantined", "Out of rotation: tasks (scope task) and whole "
                                  "env types (scope env).", labels=["owner", "scope"])
        entries = list(self.quarantine.entries.values())
        for scope in ("task", "env"):
            gauge.add_metric([self.owner, scope], sum((e.task_idx is None) == (scope == "env") for e in entries))
        yield gauge
        events = CounterMetricFamily("envfarm_quarantine_events", "Quarantines, lifts, and leases "
                                     "refused for a quarantined task.", labels=["owner", "event"])
        for event, n in sorted(self.quarantine.events.items()):
            events.add_metric([self.owner, event], n)
        yield events


def install_quarantine_routes(app: FastAPI, listing: Callable[[], Awaitable[list[QuarantinedTask]]],
                              lift: Callable[[LiftRequest, str | None], Awaitable[list[QuarantinedTask]]]
                              ) -> None:
    """``GET /quarantine`` and ``POST /quarantine/lift`` (the caller's farm API key handed to
    ``lift``): one process's, or the Serve front's over every replica."""
    key = [Depends(APIKeyHeader(name=KEY_HEADER, auto_error=False, description="A tenant's farm API key."))]

    @app.get("/quarantine", response_model=list[QuarantinedTask], tags=["farm"])
    async def quarantined() -> list[QuarantinedTask]:
        """Tasks out of rotation (new leases get ``TaskQuarantined``), and why."""
        return await listing()

    @app.post("/quarantine/lift", response_model=list[QuarantinedTask], tags=["farm"], dependencies=key,
              responses={k: {"model": ErrorBody} for k in (401, 403, 404, 422)})
    async def lift_quarantine(request: Request, req: LiftRequest) -> list[QuarantinedTask]:
        """Put a task (or every task of an env type) back into rotation; what was lifted. Takes
        the farm API key of lease creation."""
        return await lift(req, request.headers.get(KEY_HEADER))
