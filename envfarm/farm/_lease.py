"""The farm's record of one lease: what the lease table holds and verification reads (leases
are made in ``FarmCore.create_lease``, ``_core.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from envfarm.farm._served import InstanceHandle
from envfarm.farm._tenants import ANONYMOUS


@dataclass(eq=False)
class LeaseRecord:
    """The farm's record of one lease (the SDK's handle on it is ``envfarm.client.Lease``)."""

    lease_id: str
    env: str
    token: str
    instance: InstanceHandle
    task_idx: int | None
    expires_at: float
    idle_timeout_s: float
    idempotency_key: str | None = None
    tenant: str = ANONYMOUS
    last_used: float = field(default_factory=time.monotonic)
    #: requests refused for a missing or wrong credential, and requests its agent got through
    #: (MCP, tools, calls): a lease with only the first never connected (see ``_verify``)
    refused: int = 0
    agent_requests: int = 0
    #: env-side failures of tool calls since the episode began (lease or last reset)
    env_errors: list[str] = field(default_factory=list)
    #: the episode's tool calls so far, as the farm saw them (``{tool, ok, outcome}``, the
    #: first ``_core._KEPT_STEPS``); a fork keeps its parent's
    steps: list[dict[str, object]] = field(default_factory=list)
    #: the lease this one was forked from (its state and steps at that moment), if any
    forked_from: str | None = None

    def touch(self) -> None:
        self.last_used = time.monotonic()
