"""The farm without Ray: lease manager, instance pools and the lease-API app.

Used as is by ``envfarm serve --no-ray`` and inside every Serve replica; whoever builds a
``FarmCore`` hands it its verifier (``envfarm.compose.compose_core`` hands it the judge).
"""

from envfarm.errors import BadRequest, PayloadTooLarge, TaskNotFound
from envfarm.farm._app import build_app
from envfarm.farm._capability import RedactCredentials, mcp_credential, redact_path
from envfarm.farm._config import FarmConfig, LeasePolicy, PoolConfig
from envfarm.farm._core import FarmCore
from envfarm.farm._fastpath import read_body, scope_header
from envfarm.farm._http import error_response, health_response, install_error_handlers
from envfarm.farm._json_guard import JSONGuard
from envfarm.farm._lease import LeaseRecord
from envfarm.farm._local import free_port, make_server
from envfarm.farm._metrics import merge_exposition
from envfarm.farm._openenv import OPENENV_PATH, LeaseAPI, serve_socket
from envfarm.farm._pool import InstancePool
from envfarm.farm._quarantine import (
    Quarantine,
    QuarantineConfig,
    install_quarantine_routes,
    merge_quarantine,
)
from envfarm.farm._status import (
    EnvStatus,
    FarmStatus,
    ReplicaStatus,
    install_status_routes,
    summarize_status,
)
from envfarm.farm._tenants import (
    ANONYMOUS,
    KEYS_ENV,
    TENANTS_ENV,
    Quota,
    Tenant,
    Tenants,
    TenantsConfig,
    hash_key,
    is_loopback,
    load_tenants,
    new_key,
    parse_keys,
    with_environ_tenants,
)
from envfarm.farm._verify import VerifierFactory
from envfarm.wire import (
    BatchError,
    BatchItem,
    BatchRequest,
    BatchResponse,
    BatchResult,
    CallRequest,
    EnvDetail,
    EnvSummary,
    ForkRequest,
    Health,
    LeaseBatchRequest,
    LeaseInfo,
    LeaseRequest,
    LiftRequest,
    PoolStats,
    QuarantinedTask,
    ReleaseResponse,
    ReleaseStatus,
    VerifyRequest,
    VerifyResponse,
    new_owner_tag,
    owner_of,
)

__all__ = [
    "ANONYMOUS",
    "KEYS_ENV",
    "OPENENV_PATH",
    "TENANTS_ENV",
    "BadRequest",
    "BatchError",
    "BatchItem",
    "BatchRequest",
    "BatchResponse",
    "BatchResult",
    "CallRequest",
    "EnvDetail",
    "EnvStatus",
    "EnvSummary",
    "FarmConfig",
    "FarmCore",
    "FarmStatus",
    "ForkRequest",
    "Health",
    "InstancePool",
    "JSONGuard",
    "LeaseAPI",
    "LeaseBatchRequest",
    "LeaseInfo",
    "LeasePolicy",
    "LeaseRecord",
    "LeaseRequest",
    "LiftRequest",
    "PayloadTooLarge",
    "PoolConfig",
    "PoolStats",
    "Quarantine",
    "QuarantineConfig",
    "QuarantinedTask",
    "Quota",
    "RedactCredentials",
    "ReleaseResponse",
    "ReleaseStatus",
    "ReplicaStatus",
    "TaskNotFound",
    "Tenant",
    "Tenants",
    "TenantsConfig",
    "VerifierFactory",
    "VerifyRequest",
    "VerifyResponse",
    "build_app",
    "error_response",
    "free_port",
    "hash_key",
    "health_response",
    "install_error_handlers",
    "install_quarantine_routes",
    "install_status_routes",
    "is_loopback",
    "load_tenants",
    "make_server",
    "mcp_credential",
    "merge_exposition",
    "merge_quarantine",
    "new_key",
    "new_owner_tag",
    "owner_of",
    "parse_keys",
    "read_body",
    "redact_path",
    "scope_header",
    "serve_socket",
    "summarize_status",
    "with_environ_tenants",
]
