"""The last few seconds of calls and verifications per env, for the live status page.

Prometheus counters say "how many since start"; the page wants "how many per second now" and
latency percentiles, from any one process, without a Prometheus server. One bucket per second
keeps outcome counts and a log-scale latency histogram: histograms merge across replicas by
adding (percentiles do not), and recording a call is a few dict updates on the hot path.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

#: 16 latency buckets per doubling: a percentile read from them is within ~2.2 % of the truth.
_STEPS_PER_DOUBLING = 16
_SCALE = _STEPS_PER_DOUBLING / math.log(2)
_FLOOR_S = 1e-6


def latency_bucket(seconds: float) -> int:
    """The log-scale bucket of a latency (bucket k holds [2**(k/16), 2**((k+1)/16)) s)."""
    return math.floor(math.log(max(seconds, _FLOOR_S)) * _SCALE)


def bucket_seconds(bucket: int) -> float:
    """The geometric middle of a bucket."""
    return math.exp((bucket + 0.5) / _SCALE)


def quantile(hist: Mapping[int, int], q: float) -> float | None:
    """The q-quantile (0..1) in seconds of a bucket histogram; None when it is empty."""
    total = sum(hist.values())
    if total <= 0:
        return None
    rank, seen = q * total, 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= rank:
            return bucket_seconds(bucket)
    return bucket_seconds(max(hist))


def add_counts(into: dict, more: Mapping) -> None:
    for key, n in more.items():
        into[key] = into.get(key, 0) + n


class WindowStats(BaseModel):
    """One env's calls and verifications in one process over the window (mergeable)."""

    model_config = ConfigDict(extra="forbid")

    span_s: float = Field(description="Seconds the window covers (shorter just after start).")
    calls: dict[str, int] = Field(default_factory=dict, description="Tool calls by outcome.")
    verifications: dict[str, int] = Field(default_factory=dict,
                                          description="Verifications by outcome.")
    latency: dict[int, int] = Field(default_factory=dict,
                                    description="Call latency histogram: log bucket -> count.")


@dataclass
class _EnvSecond:
    calls: dict[str, int] = field(default_factory=dict)
    verifications: dict[str, int] = field(default_factory=dict)
    latency: dict[int, int] = field(default_factory=dict)


class CallWindow:
    """Per-second buckets of the last ``seconds`` seconds (the current one included)."""

    def __init__(self, seconds: int = 10, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._started = clock()
        self._buckets: deque[tuple[int, dict[str, _EnvSecond]]] = deque()
        self._second = -1
        self._current: dict[str, _EnvSecond] = {}

    def _bucket(self, env: str) -> _EnvSecond:
        second = int(self._clock())
        if second != self._second:
            self._second, self._current = second, {}
            self._buckets.append((second, self._current))
            while self._buckets[0][0] <= second - self.seconds:
                self._buckets.popleft()
        bucket = self._current.get(env)
        if bucket is None:
            bucket = self._current[env] = _EnvSecond()
        return bucket

    def record_call(self, env: str, outcome: str, seconds: float) -> None:
        bucket = self._bucket(env)
        bucket.calls[outcome] = bucket.calls.get(outcome, 0) + 1
        k = latency_bucket(seconds)
        bucket.latency[k] = bucket.latency.get(k, 0) + 1

    def record_verification(self, env: str, outcome: str) -> None:
        bucket = self._bucket(env)
        bucket.verifications[outcome] = bucket.verifications.get(outcome, 0) + 1

    def snapshot(self) -> dict[str, WindowStats]:
        """env -> what happened in the window, for every env that had a call or verification."""
        now = self._clock()
        second = int(now)
        # Whole past seconds plus the part of the current one; at least a second, so a burst
        # right after start-up does not read as a huge rate.
        span = max(1.0, min(now - self._started, self.seconds - 1 + (now - second)))
        out: dict[str, WindowStats] = {}
        for start, envs in self._buckets:
            if start <= second - self.seconds:
                continue
            for env, b in envs.items():
                w = out.get(env)
                if w is None:
                    w = out[env] = WindowStats(span_s=span)
                add_counts(w.calls, b.calls)
                add_counts(w.verifications, b.verifications)
                add_counts(w.latency, b.latency)
        return out
