"""Configuration of a farm process/replica and of the envs it serves (defaults defined once)."""

from __future__ import annotations

import logging
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from envfarm.errors import ConfinementUnavailable
from envfarm.farm._quarantine import QuarantineConfig
from envfarm.farm._schemas import ToolRendering
from envfarm.farm._tenants import TenantsConfig
from envfarm.worker import WorkerOptions

log = logging.getLogger("envfarm.farm")

#: Serving more types than this loads them on demand unless ``on_demand`` says otherwise.
ON_DEMAND_ABOVE = 16


class PoolConfig(BaseModel):
    """Sizing of one env's instance pool (per process or per replica)."""

    model_config = ConfigDict(extra="forbid")

    warm: int = Field(default=8, ge=0, le=100_000,
                      description="Reset instances kept ready so a lease never waits.")
    max_instances: int = Field(default=4096, ge=1, le=1_000_000,
                               description="Upper bound of instances (leased + free).")

    @model_validator(mode="after")
    def _warm_fits(self) -> PoolConfig:
        if self.warm > self.max_instances:
            raise ValueError(f"warm ({self.warm}) exceeds max_instances ({self.max_instances})")
        return self


class LeasePolicy(BaseModel):
    """Lifetimes of leases."""

    model_config = ConfigDict(extra="forbid")

    default_ttl_s: float = Field(default=3600.0, gt=0, description="TTL when a lease asks none.")
    max_ttl_s: float = Field(default=24 * 3600.0, gt=0, description="Longest TTL granted.")
    idle_timeout_s: float = Field(default=900.0, gt=0,
                                  description="A lease unused this long is reaped.")
    reap_interval_s: float = Field(default=1.0, gt=0, description="How often reaping runs.")
    tombstones: int = Field(default=100_000, ge=0,
                            description="Closed lease ids remembered to answer 410, not 404.")


class FarmConfig(BaseModel):
    """What one farm process (``--no-ray``) or one Serve replica serves, and how."""

    model_config = ConfigDict(extra="forbid")

    catalog: str | None = Field(default=None, description="Catalog folder; None = bundled.")
    envs: list[str] | None = Field(default=None,
                                   description="Env names to serve; None = every servable env.")
    pool: PoolConfig = Field(default_factory=PoolConfig)
    pools: dict[str, PoolConfig] = Field(default_factory=dict, description="Per-env overrides.")
    leases: LeasePolicy = Field(default_factory=LeasePolicy)
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="Larger bodies get 413.")
    verifier_workers: int = Field(default=1, ge=1, le=64,
                                  description="Sandbox worker processes for verifiers.")
    verifier_timeout_s: float = Field(default=10.0, gt=0)
    isolation: Literal["workers", "in_process"] = Field(default="workers", description=(
        "Where env code runs: 'workers' (confined worker processes; this process never runs "
        "generated code) or 'in_process' (trusted catalogs and baselines only)."))
    leases_per_worker: int = Field(default=64, ge=1, le=4096, description=(
        "Instances one env worker holds: a worker that crashes loses at most this many leases."))
    worker_memory_mb: int = Field(default=2048, ge=128, description="Address space per worker.")
    worker_retire_idle_s: float = Field(default=30.0, ge=0, description=(
        "An env worker that has held no lease this long stops, while the others keep the warm "
        "free slots (leases come back in steps: stopping at once restarted workers each step)."))
    call_timeout_s: float = Field(default=10.0, gt=0, le=600, description=(
        "A tool call past this is an env_error; a worker silent 2 s past it is killed."))
    check_module_state: bool = Field(default=True, description=(
        "At load, call every tool once in the first worker and see whether the module's "
        "globals change: such an env gets a worker per lease (its leases would see each "
        "other). Costs a probe call per tool at load."))
    allow_unconfined: bool = Field(default=False, description=(
        "Serve through workers even where the kernel cannot confine them (no seccomp or "
        "landlock): only for catalogs you trust; the status page says UNCONFINED."))
    on_demand: bool | None = Field(default=None, description=(
        "Load an env type at its first lease (or warm-up) instead of at start, and evict it "
        "after evict_idle_s without leases. None: on when more than 16 types are served."))
    hot: list[str] = Field(default_factory=list, description=(
        "Types loaded at start and never evicted (on-demand farms): the ones a trainer is "
        "about to use."))
    evict_idle_s: float = Field(default=300.0, gt=0, description=(
        "An on-demand type with no lease for this long is evicted: its workers stop."))
    max_loaded_types: int | None = Field(default=128, ge=1, description=(
        "On-demand farms: at most this many types loaded (or loading) at once in this "
        "process; loading one more first evicts the least recently used type with no lease "
        "(~60 MiB per type's worker: 128 types are ~8 GiB). None: no cap."))
    broken_retry_s: float = Field(default=60.0, gt=0, description=(
        "A type that failed to load is tried again after this, doubling with each failure "
        "(at most an hour), or at once when the catalog files changed."))
    spare_workers: int | None = Field(default=None, ge=0, le=64, description=(
        "Env workers started ahead of need (imports done, jailed, no env yet): a cold start "
        "or a new worker takes one and only loads code. None: 2 on on-demand farms, else 0."))
    tenants: TenantsConfig = Field(default_factory=TenantsConfig,
                                   description="API keys (hashed) and per-tenant quotas.")
    quarantine: QuarantineConfig = Field(default_factory=QuarantineConfig, description=(
        "When a task (or env type) whose episodes keep failing on the env's side, or that the "
        "catalog flags, is taken out of rotation."))
    public_url: str | None = Field(default=None, description=(
        "Base URL clients reach the farm at, for the absolute mcp_url of a lease; None: the "
        "URL the lease request came to."))
    tool_schemas: ToolRendering = Field(default="fastapi-mcp", description=(
        "How MCP lists tools: as AWM's server (fastapi-mcp) renders them, which models "
        "trained on AWM know and AWM's client reads, or the runtime's exact merged schemas "
        "(what HTTP /tools always lists)."))
    fast_paths: bool = Field(default=True, description=(
        "Answer plain one-call HTTP /call and MCP tools/call requests without the frameworks "
        "(same answers); False sends every request through FastAPI/FastMCP (A/B benchmarks)."))

    def loads_on_demand(self, types: int) -> bool:
        return self.on_demand if self.on_demand is not None else types > ON_DEMAND_ABOVE

    def pool_for(self, env: str) -> PoolConfig:
        return self.pools.get(env, self.pool)

    def with_envs(self, envs: list[str]) -> FarmConfig:
        return self.model_copy(update={"envs": list(envs)})

    @classmethod
    def from_options(cls, **options: Any) -> FarmConfig:
        return cls.model_validate({k: v for k, v in options.items() if v is not None})


def isolation_of(config: FarmConfig) -> tuple[str, WorkerOptions | None]:
    """How this farm runs env code: a description (health, status page) and worker options
    (None: in this process). Refuses workers the kernel cannot confine, unless allowed."""
    if config.isolation == "in_process":
        return "in-process (trusted catalog: env code runs in the serving process)", None
    from envfarm import jail

    support = jail.support()
    confined = support.ok
    if not confined and not config.allow_unconfined:
        raise ConfinementUnavailable(
            f"this kernel cannot confine env workers ({support.describe()}); refusing to run "
            "generated code. Start with --allow-unconfined for a catalog you trust, or "
            "--in-process to run it in the serving process", reason=support.describe())
    options = WorkerOptions(leases_per_worker=config.leases_per_worker,
                            retire_idle_s=config.worker_retire_idle_s,
                            call_timeout_s=config.call_timeout_s,
                            memory_mb=config.worker_memory_mb, jail=confined,
                            probe_module_state=config.check_module_state,
                            stderr=os.environ.get("ENVFARM_WORKER_STDERR") == "1")
    identity = jail.worker_identity()
    if identity.warning():
        log.warning(identity.warning())
    if confined:
        return f"workers, confined ({support.describe()}; {identity.describe()})", options
    return (f"workers, UNCONFINED (--allow-unconfined; {support.describe()}; "
            f"{identity.describe()})", options)
