"""Tenants of a shared farm: who may create leases (farm API keys) and how much (quotas).

A tenant is a name, the SHA-256 of its API key (keys are random 32-byte strings made by
``envfarm tenants new``, so a fast hash is enough; the farm never stores or logs a key) and its
quota: live leases, lease creations per second, tool calls per second. The key travels in the
``X-Envfarm-Key`` header of lease-creating requests; a lease remembers its tenant, so its calls
count against that tenant without the key. Over quota: ``QuotaExceeded`` (429 + Retry-After).

A farm that listens beyond loopback requires a key (``require_key``); a loopback dev farm may
stay open, where requests without a key are the tenant ``anonymous`` (with its own quota).

Counts are per process: the ``--no-ray`` farm, or each Serve pool replica (a tenant's quota is
enforced by every replica on the leases it owns).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfarm.errors import ConfigError, KeyInvalid, KeyMissing, QuotaExceeded

#: The request header that carries a farm API key (lease creation).
KEY_HEADER = "x-envfarm-key"
ANONYMOUS = "anonymous"
TENANT_NAME = r"^[A-Za-z0-9_.\-]{1,64}$"
QUOTAS = ("max_leases", "leases_per_s", "calls_per_s")


class Quota(BaseModel):
    """Limits of one tenant; None = no limit."""

    model_config = ConfigDict(extra="forbid")

    max_leases: int | None = Field(default=None, ge=0, description="Live leases at once.")
    leases_per_s: float | None = Field(default=None, gt=0,
                                       description="Lease creations per second (sustained).")
    calls_per_s: float | None = Field(default=None, gt=0,
                                      description="Tool calls per second (sustained).")
    burst_s: float = Field(default=1.0, gt=0, description=(
        "Seconds of the per-second rates that may be spent at once (token bucket size)."))


class Tenant(Quota):
    """A tenant: its name, the hash of its API key, and its quota."""

    name: str = Field(pattern=TENANT_NAME)
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the API key, hex.")


class TenantsConfig(BaseModel):
    """The farm's tenants (hashes only) and whether a key is required."""

    model_config = ConfigDict(extra="forbid")

    tenants: list[Tenant] = Field(default_factory=list)
    require_key: bool = Field(default=False, description=(
        "Lease creation needs a tenant's key (set when the farm listens beyond loopback)."))
    anonymous: Quota = Field(default_factory=Quota,
                             description="Quota of keyless requests on an open farm.")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "efk_" + secrets.token_urlsafe(32)


def parse_keys(text: str) -> list[Tenant]:
    """Tenants from ``name:key,name2:key2`` (the ``ENVFARM_API_KEYS`` variable, ``--api-key``);
    keys are hashed here, at once."""
    out = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, sep, key = item.partition(":")
        if not sep or not key:
            raise ConfigError("API keys are given as NAME:KEY[,NAME:KEY...]")
        out.append(_tenant({"name": name, "key_sha256": hash_key(key)}, "API key"))
    return out


def load_tenants(path: str | Path) -> list[Tenant]:
    """Tenants from a YAML/JSON file: ``{"tenants": [{name, key_sha256, max_leases, ...}]}``."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read tenants file {path}: {exc}") from exc
    items = data.get("tenants") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ConfigError(f"tenants file {path}: expected a 'tenants:' list")
    tenants = [_tenant(item, f"tenants file {path}") for item in items]
    names = [t.name for t in tenants]
    if len(set(names)) != len(names) or ANONYMOUS in names:
        raise ConfigError(f"tenants file {path}: tenant names must be unique and not "
                           f"{ANONYMOUS!r}")
    return tenants


#: Where a deployed farm finds its tenants: a tenants file's path, and NAME:KEY pairs.
TENANTS_ENV, KEYS_ENV = "ENVFARM_TENANTS", "ENVFARM_API_KEYS"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: assume it is reachable from elsewhere


def with_environ_tenants(config: TenantsConfig, path: str | Path | None = None,
                         keys: list[str] | None = None,
                         environ: Mapping[str, str] = os.environ) -> TenantsConfig:
    """``config`` plus the tenants of ``path`` (default ``$ENVFARM_TENANTS``), ``keys`` and
    ``$ENVFARM_API_KEYS`` (hashed at once): how both ``envfarm serve`` and a deployed replica
    (keys from a Kubernetes Secret) learn who may lease. Names must be unique."""
    path = path or environ.get(TENANTS_ENV) or None
    tenants = [*config.tenants, *(load_tenants(path) if path else [])]
    tenants += parse_keys(",".join([*(keys or []), environ.get(KEYS_ENV, "")]))
    if len({t.name for t in tenants}) != len(tenants):
        raise ConfigError(f"tenant names must be unique (tenants file, API keys, ${KEYS_ENV})")
    return config.model_copy(update={"tenants": tenants})


def _tenant(item: Any, where: str) -> Tenant:
    try:
        return Tenant.model_validate(item)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{where}: {loc}: {first['msg']}") from None


class _Bucket:
    """A token bucket; ``take`` answers 0 (taken) or the seconds until ``n`` tokens exist.
    Hand-written: the one library here (pyrate-limiter) answers yes/no, not when to retry."""

    def __init__(self, rate: float, burst_s: float) -> None:
        self.rate = rate
        self.size = max(1.0, rate * burst_s)
        self.tokens = self.size
        self.at = time.monotonic()

    def take(self, n: int = 1) -> float:
        now = time.monotonic()
        self.tokens = min(self.size, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if n > self.size:
            return float("inf")  # can never be granted at once
        if self.tokens >= n:
            self.tokens -= n
            return 0.0
        return (n - self.tokens) / self.rate


@dataclass
class _Usage:
    quota: Quota
    leases: int = 0
    #: Leases admitted and not yet open (placing one on a worker may wait): counted against
    #: max_leases too, so concurrent requests cannot all pass the check.
    reserved: int = 0
    created: int = 0
    calls: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    lease_bucket: _Bucket | None = None
    call_bucket: _Bucket | None = None

    def __post_init__(self) -> None:
        q = self.quota
        self.lease_bucket = _Bucket(q.leases_per_s, q.burst_s) if q.leases_per_s else None
        self.call_bucket = _Bucket(q.calls_per_s, q.burst_s) if q.calls_per_s else None


class Tenants:
    """Identifies tenants by key and keeps their usage in this process."""

    def __init__(self, config: TenantsConfig) -> None:
        self.require_key = config.require_key
        self._by_hash = {t.key_sha256: t.name for t in config.tenants}
        self.usage: dict[str, _Usage] = {t.name: _Usage(Quota.model_validate(
            t.model_dump(exclude={"name", "key_sha256"}))) for t in config.tenants}
        if not config.require_key:
            self.usage[ANONYMOUS] = _Usage(config.anonymous)

    @property
    def open(self) -> bool:
        """Anyone may create leases without a key."""
        return not self.require_key

    def identify(self, key: str | None) -> str:
        """The tenant a request's key names: 401 without one where required, 403 unknown."""
        if not key:
            if self.require_key:
                raise KeyMissing("this farm needs an API key to create leases: send "
                                 "'X-Envfarm-Key: <key>' (envfarm tenants new NAME)")
            return ANONYMOUS
        name = self._by_hash.get(hash_key(key))
        if name is None:
            raise KeyInvalid("unknown API key")
        return name

    def admit_leases(self, tenant: str, count: int = 1) -> None:
        """Count ``count`` new leases against the tenant's quota, or raise 429."""
        usage = self.usage[tenant]
        limit = usage.quota.max_leases
        if limit is not None and usage.leases + usage.reserved + count > limit:
            self._refuse(usage, tenant, "max_leases", 1.0,
                         f"tenant {tenant!r} holds {usage.leases} of its {limit} live leases; "
                         "release some")
        if usage.lease_bucket is not None:
            wait = usage.lease_bucket.take(count)
            if wait:
                self._refuse(usage, tenant, "leases_per_s", wait,
                             f"tenant {tenant!r} creates leases faster than its "
                             f"{usage.quota.leases_per_s:g}/s")
        usage.reserved += count

    def admit_call(self, tenant: str) -> None:
        usage = self.usage[tenant]
        if usage.call_bucket is not None:
            wait = usage.call_bucket.take()
            if wait:
                self._refuse(usage, tenant, "calls_per_s", wait,
                             f"tenant {tenant!r} calls tools faster than its "
                             f"{usage.quota.calls_per_s:g}/s")
        usage.calls += 1

    def opened(self, tenant: str) -> None:
        usage = self.usage[tenant]
        usage.reserved = max(usage.reserved - 1, 0)
        usage.leases += 1
        usage.created += 1

    def unreserve(self, tenant: str, count: int) -> None:
        """Give back admitted leases that were not opened (an error, an idempotent repeat)."""
        usage = self.usage[tenant]
        usage.reserved = max(usage.reserved - count, 0)

    def closed(self, tenant: str) -> None:
        self.usage[tenant].leases -= 1

    def _refuse(self, usage: _Usage, tenant: str, quota: str, wait: float, message: str) -> None:
        usage.refused[quota] = usage.refused.get(quota, 0) + 1
        retry = round(wait, 3) if wait != float("inf") else None
        raise QuotaExceeded(message, tenant=tenant, quota=quota, retry_after_s=retry)

    def status(self) -> dict[str, dict[str, Any]]:
        """Per tenant: live leases, leases created, calls, refusals by quota (no keys)."""
        return {name: {"leases": u.leases, "created": u.created, "calls": u.calls,
                       "refused": dict(u.refused)} for name, u in self.usage.items()}


class TenantCollector(Collector):
    """Per-tenant counts on /metrics, read at scrape time."""

    def __init__(self, owner: str, tenants: Tenants) -> None:
        self.owner = owner
        self.tenants = tenants

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["owner", "tenant"]
        leases = GaugeMetricFamily("envfarm_tenant_leases_active", "Live leases per tenant.",
                                   labels=labels)
        created = CounterMetricFamily("envfarm_tenant_leases_created", "Leases created per "
                                      "tenant.", labels=labels)
        calls = CounterMetricFamily("envfarm_tenant_calls", "Tool calls per tenant.",
                                    labels=labels)
        refused = CounterMetricFamily("envfarm_tenant_refused", "Requests refused over quota.",
                                      labels=[*labels, "quota"])
        for name, u in self.tenants.usage.items():
            leases.add_metric([self.owner, name], u.leases)
            created.add_metric([self.owner, name], u.created)
            calls.add_metric([self.owner, name], u.calls)
            for quota in QUOTAS:  # zeros too: a rate() over the series needs them
                refused.add_metric([self.owner, name, quota], u.refused.get(quota, 0))
        yield from (leases, created, calls, refused)
