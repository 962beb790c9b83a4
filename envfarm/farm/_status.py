"""The live status page: ``/status`` (a static page), ``/status.json`` (what it polls), ``/``.

Each process or replica reports a ``ReplicaStatus`` (its pools, leases and rolling window);
``summarize_status`` turns one (``--no-ray``) or many (the Serve front fans out) into the page's
``FarmStatus``: rates add up across replicas, latency histograms merge, then percentiles.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field

from envfarm.farm._quarantine import merge_quarantine
from envfarm.farm._window import WindowStats, add_counts, quantile
from envfarm.verdict import reward_for
from envfarm.wire import PoolStats, QuarantinedTask, TypeCounts

_CALL_ERRORS = ("agent_error", "env_error")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaStatus(_Model):
    """What one process or Serve replica knows about itself."""

    owner: str = Field(description="Owner tag: the prefix of the lease ids it hands out.")
    app: str | None = Field(default=None, description="Serve application (None: --no-ray).")
    node: str | None = Field(default=None, description="Ray node id (None: --no-ray).")
    pid: int
    leases: int = Field(description="Leases it holds.")
    pools: list[PoolStats]
    window: dict[str, WindowStats] = Field(description="env -> the last seconds' activity.")
    isolation: str = Field(default="", description="Where its env code runs (confined or not).")
    types: TypeCounts = Field(default_factory=TypeCounts,
                              description="Its env types: loaded, cold, broken, churn.")
    tenants: dict[str, TenantUsage] = Field(default_factory=dict,
                                            description="tenant -> its use of this process.")
    quarantined: list[QuarantinedTask] = Field(default_factory=list,
                                               description="Tasks it holds out of rotation.")


class TenantUsage(_Model):
    """One tenant's counts (since start; per process, added up across replicas)."""

    leases: int = Field(description="Live leases.")
    created: int = Field(description="Leases created.")
    calls: int = Field(description="Tool calls admitted.")
    refused: dict[str, int] = Field(description="Requests refused, by quota.")


class TenantStatus(TenantUsage):
    tenant: str


class ReplicaInfo(_Model):
    owner: str
    app: str | None
    node: str | None = None
    pid: int
    envs: list[str]
    leases: int


class ErrorRates(_Model):
    """Shares (0..1) over the window; None when there was nothing to divide by."""

    agent_error: float | None = Field(description="Tool calls the agent got wrong.")
    env_error: float | None = Field(description="Tool calls the env failed.")
    invalid_verify: float | None = Field(
        description="Verifications with no verdict on the agent (invalid, environment_error).")


class EnvStatus(_Model):
    env: str
    replicas: int = Field(description="Replicas that serve it and answered.")
    warm: int = Field(description="Reset instances ready to lease.")
    leased: int = Field(description="Instances held by live leases (= live leases).")
    resetting: int
    calls_per_s: float
    calls: int = Field(description="Tool calls in the window.")
    verifications: int = Field(description="Verifications in the window.")
    errors: ErrorRates
    p50_ms: float | None
    p99_ms: float | None


class FarmStatus(_Model):
    """The body of ``GET /status.json``."""

    mode: str = Field(description="'no-ray' or 'serve'.")
    generated_at: float = Field(description="Unix time.")
    window_s: float = Field(description="Seconds the rates and percentiles cover.")
    leases: int
    calls_per_s: float
    replicas: list[ReplicaInfo]
    unreachable: int = Field(default=0, description="Replicas that did not answer.")
    envs: list[EnvStatus]
    types: TypeCounts = Field(default_factory=TypeCounts, description=(
        "Env types summed over the replicas that answered (a type served by two replicas "
        "counts twice)."))
    tenants: list[TenantStatus] = Field(default_factory=list)
    open: bool | None = Field(default=None, description=(
        "Leases may be created without an API key (a loopback dev farm)."))
    ready: bool | None = Field(default=None, description="What /healthz says (see Health).")
    quarantined: list[QuarantinedTask] = Field(default_factory=list, description=(
        "Tasks out of rotation, merged across the replicas that answered."))


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def summarize_status(replicas: list[ReplicaStatus], envs: list[str], mode: str, *,
                     unreachable: int = 0, open_farm: bool | None = None,
                     ready: bool | None = None) -> FarmStatus:
    """One view of the farm from every replica that answered; ``envs``: the envs served."""
    names = sorted(set(envs) | {p.env for r in replicas for p in r.pools})
    rows = []
    for env in names:
        pools = [p for r in replicas for p in r.pools if p.env == env]
        windows = [r.window[env] for r in replicas if env in r.window]
        calls: dict[str, int] = {}
        verifications: dict[str, int] = {}
        latency: dict[int, int] = {}
        for w in windows:
            add_counts(calls, w.calls)
            add_counts(verifications, w.verifications)
            add_counts(latency, w.latency)
        n_calls, n_verify = sum(calls.values()), sum(verifications.values())
        invalid = sum(n for outcome, n in verifications.items() if reward_for(outcome) is None)
        rows.append(EnvStatus(
            env=env, replicas=len(pools), warm=sum(p.free for p in pools),
            leased=sum(p.leased for p in pools), resetting=sum(p.resetting for p in pools),
            calls_per_s=round(sum(sum(w.calls.values()) / w.span_s for w in windows), 3),
            calls=n_calls, verifications=n_verify,
            errors=ErrorRates(**{k: _share(calls.get(k, 0), n_calls) for k in _CALL_ERRORS},
                              invalid_verify=_share(invalid, n_verify)),
            p50_ms=_ms(quantile(latency, 0.5)), p99_ms=_ms(quantile(latency, 0.99))))
    window_s = max((w.span_s for r in replicas for w in r.window.values()), default=0.0)
    infos = [ReplicaInfo(owner=r.owner, app=r.app, node=r.node, pid=r.pid,
                         envs=[p.env for p in r.pools], leases=r.leases)
             for r in sorted(replicas, key=lambda r: (r.node or "", r.owner))]  # by node
    return FarmStatus(mode=mode, generated_at=time.time(), window_s=window_s,
                      leases=sum(r.leases for r in replicas),
                      calls_per_s=round(sum(e.calls_per_s for e in rows), 3),
                      replicas=infos, unreachable=unreachable, envs=rows,
                      types=sum((r.types for r in replicas), TypeCounts()),
                      tenants=_tenants(replicas), open=open_farm, ready=ready,
                      quarantined=merge_quarantine([r.quarantined for r in replicas]))


def _tenants(replicas: list[ReplicaStatus]) -> list[TenantStatus]:
    merged: dict[str, TenantStatus] = {}
    for r in replicas:
        for name, u in r.tenants.items():
            t = merged.setdefault(name, TenantStatus(tenant=name, leases=0, created=0, calls=0,
                                                     refused={}))
            t.leases += u.leases
            t.created += u.created
            t.calls += u.calls
            add_counts(t.refused, u.refused)
    return [merged[name] for name in sorted(merged)]


def status_page() -> str:
    """The page itself: one static file shipped with the package (no build step)."""
    return resources.files("envfarm.farm").joinpath("static/status.html").read_text("utf-8")


def install_status_routes(app: FastAPI, status: Callable[[], Awaitable[FarmStatus]]) -> None:
    """``/`` -> ``/status`` (the page), which polls ``/status.json`` (``status()``)."""
    page = status_page()

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("status")  # relative: works under any path prefix

    @app.get("/status", response_class=HTMLResponse, tags=["farm"])
    async def status_html() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/status.json", response_model=FarmStatus, tags=["farm"])
    async def status_json() -> FarmStatus:
        return await status()
