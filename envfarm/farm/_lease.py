"""The farm's lease table: its records, the idempotency keys that made them, and the tombstones of
closed ones (a closed or foreign lease id gets 410, an unknown one 404). ``FarmCore`` (``_core.py``)
decides when leases open and close; this module keeps the books."""

from __future__ import annotations

import secrets
import time
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from envfarm.errors import EnvfarmError, LeaseGone, LeaseNotFound
from envfarm.farm._config import LeasePolicy
from envfarm.farm._served import InstanceHandle
from envfarm.farm._tenants import ANONYMOUS
from envfarm.wire import new_lease_id, owner_of


class StepLog:
    """An episode's tool calls as the farm saw them, ``{tool, ok, outcome}`` each (the first
    ``LIMIT``). Kept as two 16-bit indices per call into the log's own table of names: a dict
    per call cost a long-held lease ~190 bytes a call (175 KB after a thousand calls, which a
    soak of 1,024 leases saw as the replicas' RSS growing); this costs 4. The table is per log,
    so an agent's made-up tool names go when its episode does, and each is cut to 128 chars."""

    __slots__ = ("_codes", "_names", "_ids")
    LIMIT = 1000

    def __init__(self) -> None:
        self._codes = array("H")  # tool, outcome, tool, outcome, ...
        self._names: list[str] = []
        self._ids: dict[str, int] = {}

    def append(self, tool: str, outcome: str) -> None:
        if len(self._codes) < 2 * self.LIMIT:
            self._codes.extend((self._id(tool[:128]), self._id(outcome)))

    def _id(self, name: str) -> int:
        got = self._ids.get(name)
        if got is None:  # at most 2 * LIMIT names: fits 16 bits
            got = self._ids[name] = len(self._names)
            self._names.append(name)
        return got

    def __len__(self) -> int:
        return len(self._codes) // 2

    def __iter__(self) -> Iterator[dict[str, object]]:
        names, codes = self._names, self._codes
        for k in range(0, len(codes), 2):
            outcome = names[codes[k + 1]]
            yield {"tool": names[codes[k]], "ok": outcome == "ok", "outcome": outcome}

    def copy(self) -> StepLog:
        twin = StepLog()
        twin._codes, twin._names, twin._ids = array("H", self._codes), list(self._names), dict(self._ids)
        return twin

    def clear(self) -> None:
        self.__init__()


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
    #: the episode's tool calls so far, as the farm saw them; a fork keeps its parent's
    steps: StepLog = field(default_factory=StepLog)
    #: the lease this one was forked from (its state and steps at that moment), if any
    forked_from: str | None = None

    def touch(self) -> None:
        self.last_used = time.monotonic()


class LeaseTable:
    """Open leases by id (``open``), the lease each (tenant, env, idempotency key) made, and why
    each recently closed lease closed (the last ``policy.tombstones``)."""

    def __init__(self, owner: str, policy: LeasePolicy) -> None:
        self.owner, self.policy = owner, policy
        self.open: dict[str, LeaseRecord] = {}
        self._by_key: dict[tuple[str, str, str], str] = {}
        self._closed: OrderedDict[str, str] = OrderedDict()

    def made_by(self, tenant: str, env: str, key: str | None) -> LeaseRecord | None:
        """The open lease this idempotency key made, if any (no key: none)."""
        if key is None:
            return None
        lease_id = self._by_key.get((tenant, env, key))
        return None if lease_id is None else self.open.get(lease_id)

    def add(self, env: str, instance: InstanceHandle, task_idx: int | None, ttl_s: float | None,
            idempotency_key: str | None, tenant: str) -> LeaseRecord:
        """A new lease on ``instance``, its TTL and idle timeout capped by the policy."""
        ttl = min(ttl_s or self.policy.default_ttl_s, self.policy.max_ttl_s)
        lease = LeaseRecord(lease_id=new_lease_id(self.owner), env=env,
                            token=secrets.token_urlsafe(24), instance=instance,
                            task_idx=task_idx, expires_at=time.time() + ttl,
                            idle_timeout_s=min(self.policy.idle_timeout_s, ttl),
                            idempotency_key=idempotency_key, tenant=tenant)
        self.open[lease.lease_id] = lease
        if idempotency_key is not None:
            self._by_key[(tenant, env, idempotency_key)] = lease.lease_id
        return lease

    def remove(self, lease: LeaseRecord, why: str) -> bool:
        """Take an open lease off the table, remembering why; False if it was not open."""
        if self.open.pop(lease.lease_id, None) is None:
            return False
        if lease.idempotency_key is not None:
            self._by_key.pop((lease.tenant, lease.env, lease.idempotency_key), None)
        self._closed[lease.lease_id] = why
        while len(self._closed) > self.policy.tombstones:
            self._closed.popitem(last=False)
        return True

    def closed_why(self, lease_id: str) -> str | None:
        return self._closed.get(lease_id)

    def missing(self, lease_id: str) -> EnvfarmError:
        """The error for a lease id that is not open: 410 if it closed here or belongs to another
        (gone) owner, else 404."""
        why = self._closed.get(lease_id)
        if why is not None:
            reason = "lease_lost" if why.startswith("lease_lost:") else why
            return LeaseGone(f"lease {lease_id} is closed: {why}; start a new lease",
                             lease_id=lease_id, reason=reason)
        owner = owner_of(lease_id)
        if owner and owner != self.owner:
            return LeaseGone(f"lease {lease_id} belongs to replica {owner!r}, which is gone; its "
                             "state is lost, start a new lease", lease_id=lease_id, owner=owner)
        return LeaseNotFound(f"no lease {lease_id}", lease_id=lease_id)
