"""Which HTTP ingress the farm runs on: Serve's HAProxy ingress (default) or its Python proxy.

With HAProxy ingress ("direct ingress") HAProxy sends each request straight to a replica of the
app's ingress deployment, picked by its own load balancing; Serve refuses a custom request router
on that deployment (it would be bypassed). So under HAProxy a pool app is laid out by size:

- one replica: the pool is the app's ingress, no router. That replica owns every live lease of
  its envs; a lease it does not own is gone (its owner died), and the core answers 410.
- several replicas (or autoscaling): a stateless ``Door`` is the app's ingress and forwards each
  request by handle to the pool, where ``LeaseRouter`` (allowed off the ingress) picks the owner.

With the Python proxy the pool is the ingress and keeps ``LeaseRouter`` (the proxy routes by
handle). The mode is a property of the Ray cluster: Serve reads these variables when its
processes import it, so they are set before Ray starts (``use_ingress``), or in the cluster's
environment (cluster/, k8s/).
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Literal

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from cluster.serve._options import DeploymentOptions, access_logging
from envfarm.errors import EnvfarmError, ErrorKind
from envfarm.farm import FarmConfig

Proxy = Literal["haproxy", "python"]

ENV_HAPROXY = "RAY_SERVE_ENABLE_HA_PROXY"
ENV_THROUGHPUT = "RAY_SERVE_THROUGHPUT_OPTIMIZED"

LEASE_ROUTER = RequestRouterConfig(request_router_class="cluster.serve._router:LeaseRouter",
                                   request_routing_stats_period_s=1.0,
                                   request_routing_stats_timeout_s=1.0)


class IngressMismatch(EnvfarmError):
    """The Ray cluster runs another ingress than the one asked for."""

    kind = ErrorKind.invalid_request
    status_code = 400


#: How the farm tunes Ray under HAProxy ingress (defaults: a value already set wins). Measured
#: with 1,024 clients on one pool replica (benchmarks/load/soak.py; RESULTS.md, "Soak").
HAPROXY_TUNING = {
    # HAProxy opens one connection per in-flight request, so 1,024 clients mean 1,024
    # connections to one replica, whose event loop then accepts new ones (HAProxy's health
    # checks too) many seconds late: HAProxy marks the busy replica down and sends its traffic
    # through the Python-proxy fallback (slower; the ProxyActor and the replica grew without
    # end). With a per-server maxconn HAProxy keeps a few connections busy and queues the rest
    # itself, in C, first come first served. Serve 2.60 has no setting for it, but writes this
    # value as is into every backend's ``default-server`` line, so it carries the maxconn.
    "RAY_SERVE_HAPROXY_HEALTH_CHECK_DOWNINTER": "250ms maxconn 64",
    # That queue waits up to ``timeout connect`` (Serve sets no ``timeout queue``); Serve's 5 s
    # turned a 1,024-deep queue into 503s. A dead local replica still fails at once (refused).
    "RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S": "30",
    # For Serve's HTTP metrics HAProxy sends a log line per request to the node's HAProxyManager,
    # one Python actor, which parses it: ~90 µs of CPU per request (RESULTS.md, "Serve's own
    # cost"), a whole core at ~10k requests/s per node. Off, each replica counts its own
    # requests (a few µs each, spread over the replicas); the farm's /metrics counts calls.
    "RAY_SERVE_HAPROXY_METRICS_ENABLED": "0",
}
#: Ray core settings for a farm in any mode: per-task events (the dashboard's task table) cost
#: memory on every handle call (an actor grew 15 MiB over 100k calls, flat without) and no farm
#: reads them.
RAY_TUNING = {"RAY_task_events_report_interval_ms": "0"}


#: Where Serve's HAProxy keeps its config, sockets and state (Serve's defaults, by variable).
SERVE_HAPROXY_DIR = "/tmp/haproxy-serve"
HAPROXY_FILES = {"RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg",
                 "RAY_SERVE_HAPROXY_SOCKET_PATH": "admin.sock",
                 "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": "",
                 "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
                 "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "metrics.sock"}


def haproxy_files(default: str = SERVE_HAPROXY_DIR) -> dict[str, str]:
    """Where this process's HAProxy may write: nothing to change when Serve's fixed folder is
    ours, else a private one (on a shared machine another user, root say, may own that folder,
    and Serve then fails to start: a user's `make demo` after root's `make test`)."""
    try:
        os.makedirs(default, exist_ok=True)
        if os.access(default, os.W_OK | os.X_OK):
            return {}
    except OSError:
        pass
    own = tempfile.mkdtemp(prefix="haproxy-serve-", dir="/tmp")  # short: sockets live in it
    logging.getLogger("cluster.serve").warning(
        "%s belongs to another user: Serve's HAProxy keeps its files in %s", default, own)
    return {key: os.path.join(own, name) if name else own for key, name in HAPROXY_FILES.items()}


def ingress_env(proxy: Proxy) -> dict[str, str]:
    """The Serve environment variables of an ingress mode."""
    on = "1" if proxy == "haproxy" else "0"
    return {ENV_HAPROXY: on, ENV_THROUGHPUT: on}


def farm_env(proxy: Proxy) -> dict[str, str]:
    """Every variable the farm's Ray processes run with: the mode and its tuning."""
    return {**ingress_env(proxy), **(HAPROXY_TUNING if proxy == "haproxy" else {}), **RAY_TUNING}


def use_ingress(proxy: Proxy) -> None:
    """Set the mode (and, unless set, its tuning) for Ray processes started from here on
    (call before ``ray.init``)."""
    for key, value in farm_env(proxy).items():
        os.environ.setdefault(key, value)
    os.environ.update(ingress_env(proxy))
    if proxy == "haproxy" and not any(key in os.environ for key in HAPROXY_FILES):
        os.environ.update(haproxy_files())


def current_proxy(env: dict[str, str] | os._Environ[str] | None = None) -> Proxy:
    """The mode this process's environment asks Serve for (how Serve itself reads it)."""
    env = os.environ if env is None else env
    return "haproxy" if env.get(ENV_HAPROXY, "0") == "1" else "python"


def behind_door(options: DeploymentOptions, proxy: Proxy) -> bool:
    """Whether a pool needs a Door in front: HAProxy mode and more than one replica possible."""
    if proxy != "haproxy":
        return False
    return options.autoscaling_config is not None or options.num_replicas > 1


def pool_application(farm: dict[str, Any], options: DeploymentOptions, proxy: Proxy
                     ) -> Application:
    """A pool app (deployment ``pool``) laid out for the ingress mode; see the module doc."""
    from cluster.serve._deployments import PoolReplica
    from cluster.serve._door import Door

    if proxy == "python":
        return serve.deployment(PoolReplica, name="pool", request_router_config=LEASE_ROUTER,
                                **options.serve_kwargs()).bind(farm)
    if not behind_door(options, proxy):
        return serve.deployment(PoolReplica, name="pool", **options.serve_kwargs()).bind(farm)
    pool = serve.deployment(PoolReplica, name="pool", request_router_config=LEASE_ROUTER,
                            **options.serve_kwargs()).bind(farm)
    door = serve.deployment(Door, name="door", num_replicas=options.door_replicas,
                            max_ongoing_requests=options.max_ongoing_requests * 2,
                            ray_actor_options={"num_cpus": 0},
                            logging_config=access_logging(options.access_log))
    return door.bind(pool, FarmConfig.model_validate(farm).max_body_bytes, options.hop)
