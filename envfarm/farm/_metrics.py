"""Prometheus metrics of one farm process/replica, in a private registry (no global state)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from envfarm.wire import PoolStats, TypeCounts

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class _PoolCollector(Collector):
    """Gauges read at scrape time, so they can never drift from the pools."""

    def __init__(self, owner: str, pools: Callable[[], list[PoolStats]],
                 leases: Callable[[], int], types: Callable[[], TypeCounts]) -> None:
        self.owner = owner
        self.pools = pools
        self.leases = leases
        self.types = types

    def collect(self) -> Iterator[GaugeMetricFamily]:
        active = GaugeMetricFamily("envfarm_leases_active", "Leases currently held.",
                                   labels=["owner"])
        active.add_metric([self.owner], self.leases())
        yield active
        fams = {name: GaugeMetricFamily(f"envfarm_pool_{name}", f"Instances {name} per env.",
                                        labels=["owner", "env"])
                for name in ("free", "leased", "resetting")}
        for st in self.pools():
            for name, fam in fams.items():
                fam.add_metric([self.owner, st.env], getattr(st, name))
        yield from fams.values()
        types = self.types()
        states = GaugeMetricFamily("envfarm_env_types", "Env types served, by state "
                                   "(on-demand farms load a type at its first lease).",
                                   labels=["owner", "state"])
        for state in ("loaded", "loading", "cold", "broken"):
            states.add_metric([self.owner, state], getattr(types, state))
        yield states
        cap = GaugeMetricFamily("envfarm_env_types_max_loaded", "Cap on loaded + loading env "
                                "types (0: none).", labels=["owner"])
        cap.add_metric([self.owner], types.max_loaded)
        yield cap
        for name, what in (
                ("cold_starts", "Env types loaded at first use."),
                ("evictions", "Env types unloaded (workers stopped): idle, or for room."),
                ("evicted_for_room", "LRU idle types evicted to load another under the cap."),
                ("refused_at_cap", "Cold starts refused at the cap (every loaded type in use)."),
                ("broken_retries", "Loads of broken types tried again.")):
            counter = CounterMetricFamily(f"envfarm_env_{name}", what, labels=["owner"])
            counter.add_metric([self.owner], getattr(types, name))
            yield counter


class FarmMetrics:
    def __init__(self, owner: str, pools: Callable[[], list[PoolStats]],
                 leases: Callable[[], int], types: Callable[[], TypeCounts] = TypeCounts
                 ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_PoolCollector(owner, pools, leases, types))
        self.calls = Counter("envfarm_calls", "Tool calls by outcome.",
                             ["env", "outcome"], registry=self.registry)
        self.call_latency = Histogram("envfarm_call_latency_seconds", "Tool call latency.",
                                      ["env"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.lease_latency = Histogram("envfarm_lease_acquire_seconds", "Lease acquire latency.",
                                       ["env"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.lease_events = Counter("envfarm_lease_events", "Lease lifecycle events.",
                                    ["env", "event"], registry=self.registry)
        self.verifications = Counter("envfarm_verifications", "Verifications by outcome.",
                                     ["env", "outcome"], registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def merge_exposition(texts: list[bytes]) -> bytes:
    """Merge Prometheus text from several replicas: one HELP/TYPE header per family, samples
    grouped under it (the text format forbids a family appearing twice)."""
    order: list[str] = []
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for text in texts:
        family = ""
        for line in text.decode().splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line.split(" ", 3)[2]
                if family not in headers:
                    order.append(family)
                    headers[family] = []
                    samples[family] = []
                if line not in headers[family]:
                    headers[family].append(line)
            elif line and not line.startswith("#"):
                samples.setdefault(family, []).append(line)
                if family not in headers:
                    order.append(family)
                    headers[family] = []
    out = [line for f in order for line in headers[f] + samples[f]]
    return ("\n".join(out) + "\n").encode()
