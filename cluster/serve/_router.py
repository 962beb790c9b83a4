"""Owner routing: follow-up calls of a lease go to the replica that made it.

A lease id starts with its owner replica's unique id (``<owner>-<random>``). HTTP requests from
Serve's proxy carry the ASGI scope (pickled), so the path names the lease; handle calls pass
``owner=`` as a keyword. When the owner is not among the running replicas the request goes to
any replica, which answers 410 Gone because the lease is not its own: never a fresh state.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from envfarm.wire import owner_of

#: ``owner="#<i>"`` on a handle call targets the i-th replica in id order (metrics fan-out).
INDEX_PREFIX = "#"


def owner_from_path(path: str) -> str | None:
    """``/envs/<env>/leases/<owner>-<rand>/...`` or ``/envs/<env>/owners/<owner>/...`` ->
    ``<owner>``."""
    parts = path.split("/")
    if "owners" in parts:
        i = parts.index("owners")
        return parts[i + 1] or None if i + 1 < len(parts) else None
    try:
        i = parts.index("leases")
    except ValueError:
        return None
    if i + 1 >= len(parts) or not parts[i + 1]:
        return None
    return owner_of(parts[i + 1]) or None


def owner_of_request(request: PendingRequest | None) -> str | None:
    if request is None:
        return None
    owner = request.kwargs.get("owner")
    if isinstance(owner, str):
        return owner
    if request.args and isinstance(request.args[0], bytes):
        try:
            scope = pickle.loads(request.args[0]).asgi_scope
        except Exception:  # noqa: BLE001 - not a proxied HTTP request
            return None
        return owner_from_path(scope.get("path", ""))
    return None


class LeaseRouter(RequestRouter):
    """Routes lease calls to their owner; anything else (new leases) to the less loaded of two
    random replicas, by the lease counts replicas report plus what this router sent since."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        owner = owner_of_request(pending_request)
        if owner is not None:
            if owner.startswith(INDEX_PREFIX):
                ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
                index = int(owner[1:]) if owner[1:].isdigit() else 0
                return [[ordered[index % len(ordered)]]]
            for replica in candidate_replicas:
                if replica.replica_id.unique_id == owner:
                    return [[replica]]
            # Owner gone: any replica answers 410 for a lease that is not its own.
        return [self._least_loaded(candidate_replicas)]

    def _least_loaded(self, replicas: list[RunningReplica]) -> list[RunningReplica]:
        # Reported stats are up to a period old: count what was sent since, or a burst of new
        # leases would all land on the replica that looked emptiest a second ago.
        seen: dict[str, Any] = self.__dict__.setdefault("_envfarm_seen", {})
        sent: dict[str, int] = self.__dict__.setdefault("_envfarm_sent", {})

        def load(replica: RunningReplica) -> int:
            key = replica.replica_id.unique_id
            stats = replica.routing_stats or {}
            if seen.get(key) is not stats:
                seen[key], sent[key] = stats, 0
            return int(stats.get("leases", 0)) + sent[key]

        picks = sorted(random.sample(replicas, min(2, len(replicas))), key=load)
        sent[picks[0].replica_id.unique_id] += 1
        return picks
