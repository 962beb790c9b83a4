"""Client SDK of the farm: async ``Farm`` (primary) and ``SyncFarm`` for scripts."""

from envfarm.client._client import Farm, Lease
from envfarm.client._episode import EpisodeReport, reference_episode
from envfarm.client._errors import EnvError, LeaseLost, error_from_wire
from envfarm.client._openenv import openenv_base_url
from envfarm.client._sync import SyncFarm, SyncLease
from envfarm.client._transport import (
    AiohttpTransport,
    ASGITransport,
    HTTPTransport,
    HttpxTransport,
    Reply,
    Transport,
)
from envfarm.errors import (
                            AgentError,
                            EnvfarmError,
                            LeaseForbidden,
                            LeaseNotFound,
                            LeaseUnauthorized,
                            PoolExhausted,
                            TaskQuarantined,
                            TransportError,
)

__all__ = [
    "ASGITransport",
    "AgentError",
    "AiohttpTransport",
    "EnvError",
    "EnvfarmError",
    "EpisodeReport",
    "Farm",
    "HTTPTransport",
    "HttpxTransport",
    "Lease",
    "LeaseForbidden",
    "LeaseLost",
    "LeaseNotFound",
    "LeaseUnauthorized",
    "PoolExhausted",
    "Reply",
    "SyncFarm",
    "SyncLease",
    "TaskQuarantined",
    "Transport",
    "TransportError",
    "error_from_wire",
    "openenv_base_url",
    "reference_episode",
]
