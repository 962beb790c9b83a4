"""The farm without Ray: lease manager, instance pools and the lease-API app.

Used as is by ``envfarm serve --no-ray`` and inside every Ray Serve replica.
"""

from envfarm.farm._app import build_app
from envfarm.farm._config import FarmConfig, LeasePolicy, PoolConfig
from envfarm.farm._core import FarmCore, Lease, new_owner_tag, owner_of
from envfarm.farm._errors import BadRequest, PayloadTooLarge, TaskNotFound
from envfarm.farm._local import LocalFarm, free_port, make_server
from envfarm.farm._pool import InstancePool
from envfarm.farm._wire import (
                                BatchItem,
                                BatchRequest,
                                BatchResponse,
                                BatchResult,
                                CallRequest,
                                CallResponse,
                                EnvDetail,
                                EnvSummary,
                                Health,
                                LeaseBatchRequest,
                                LeaseInfo,
                                LeaseRequest,
                                PoolStats,
                                ReleaseResponse,
                                ReleaseStatus,
                                VerifyRequest,
                                VerifyResponse,
)

__all__ = [
    "BadRequest",
    "BatchItem",
    "BatchRequest",
    "BatchResponse",
    "BatchResult",
    "CallRequest",
    "CallResponse",
    "EnvDetail",
    "EnvSummary",
    "FarmConfig",
    "FarmCore",
    "Health",
    "InstancePool",
    "Lease",
    "LeaseBatchRequest",
    "LeaseInfo",
    "LeasePolicy",
    "LeaseRequest",
    "LocalFarm",
    "PayloadTooLarge",
    "PoolConfig",
    "PoolStats",
    "ReleaseResponse",
    "ReleaseStatus",
    "TaskNotFound",
    "VerifyRequest",
    "VerifyResponse",
    "build_app",
    "free_port",
    "make_server",
    "new_owner_tag",
    "owner_of",
]
