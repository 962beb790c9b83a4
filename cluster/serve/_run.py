"""Start and stop the farm on an embedded local Ray (no cluster needed) or a running cluster."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ray
import ray._private.utils
from ray import serve

from cluster.serve._build import FRONT_APP, AppPlan, applications, plan
from cluster.serve._handles import fresh_call
from cluster.serve._direct import LISTENER_HOST_ENV
from cluster.serve._ingress import (
    ENV_HAPROXY,
    IngressMismatch,
    Proxy,
    current_proxy,
    use_ingress,
)
from cluster.serve._options import ServeOptions
from envfarm.farm import FarmConfig

#: Serve holds a stopping direct-ingress replica open this long so external load balancers can
#: deregister it (30 s by default, so every stop took 30 s). On the embedded local Ray the only
#: balancer is the node's own HAProxy, which reloads in well under a second.
ENV_DRAIN = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
LOCAL_DRAIN_S = "2"


@dataclass
class RunningFarm:
    """A farm running on Serve: where it listens and what it serves."""

    url: str
    plans: list[AppPlan]
    started_ray: bool
    startup_s: float
    envs: list[str] = field(default_factory=list)
    proxy: Proxy = "haproxy"

    def instances_ready(self, warm: int) -> int:
        return sum(len(p.envs) * warm * p.options.num_replicas for p in self.plans)

    def shutdown(self) -> None:
        """Answer the requests in flight (new ones get 503), then stop Serve (and Ray)."""
        try:
            asyncio.run(asyncio.wait_for(_drain(), 3.0))
        except Exception as exc:  # noqa: BLE001 - stopping anyway
            logging.getLogger("cluster.serve").warning("draining the farm failed: %s", exc)
        serve.shutdown()
        if self.started_ray:
            ray.shutdown()


async def _drain() -> None:
    # In an event loop: handles of a throughput-optimized Serve route in the caller's loop.
    front = serve.get_deployment_handle("front", app_name=FRONT_APP)
    await fresh_call(front.drain, timeout_s=2.0)


def start_farm(config: FarmConfig, options: ServeOptions, *, address: str | None = None
               ) -> RunningFarm:
    """Deploy every app of the farm and wait until they run. ``address``: an existing cluster."""
    started = time.perf_counter()
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # keep start-up output readable
    started_ray = False
    if not ray.is_initialized():
        if address is not None:
            _keeping_sigterm(lambda: ray.init(address=address, log_to_driver=False))
        else:
            use_ingress(options.proxy)  # the embedded Ray's processes inherit it
            os.environ.setdefault(ENV_DRAIN, LOCAL_DRAIN_S)
            # The pool replicas' own listeners: loopback, as everything of an embedded farm.
            os.environ.setdefault(LISTENER_HOST_ENV, "127.0.0.1")
            # address="local": a new embedded cluster, never one another program left behind
            _keeping_sigterm(lambda: ray.init(
                address="local", num_cpus=options.num_cpus, include_dashboard=False,
                log_to_driver=False, configure_logging=False))
        started_ray = True
    _check_cluster_ingress(options.proxy)
    serve.start(http_options={"host": options.host, "port": options.port},
                logging_config={"log_level": "WARNING"})
    plans = plan(config, options)
    serve.run_many(applications(config, options, plans), wait_for_applications_running=True)
    return RunningFarm(url=f"http://{options.host}:{options.port}", plans=plans,
                       started_ray=started_ray, startup_s=time.perf_counter() - started,
                       envs=[e for p in plans for e in p.envs], proxy=options.proxy)


def _keeping_sigterm(init: Callable[[], object]) -> None:
    """Run ``init`` (a ``ray.init``) without losing the caller's own SIGTERM handler.

    From the main thread ray.init replaces it with one that exits the driver at once
    (``sys.exit(15)``): a SIGTERM while the farm was still starting then cut the start short
    instead of stopping the farm in order. With a handler of the caller's, Ray's is not put in
    (its one setter is skipped meanwhile: a ray.init from another thread, which also skips it,
    hung Serve's start). Ray's core worker also puts a C-level crash reporter on SIGTERM,
    which aborts the driver (exit -6) after a handler ran: putting the caller's handler back
    with ``signal.signal`` once ray.init returns takes it off. With no handler of the caller's,
    Ray's exit (and its shutdown at exit) is the right default."""
    mine = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or not callable(mine):
        init()
        return
    utils = ray._private.utils
    setter = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        init()
    finally:
        utils.set_sigterm_handler = setter
        signal.signal(signal.SIGTERM, mine)  # unconditionally: getsignal cannot see the C one


@ray.remote(num_cpus=0)
def _cluster_haproxy_setting() -> str:
    return os.environ.get(ENV_HAPROXY, "0")


def _check_cluster_ingress(proxy: Proxy) -> None:
    """Serve's ingress mode comes from the cluster's environment: refuse to lay the farm out for
    the other one (the layouts differ; see cluster.serve._ingress)."""
    running = current_proxy({ENV_HAPROXY: ray.get(_cluster_haproxy_setting.remote())})
    if running != proxy:
        raise IngressMismatch(
            f"the Ray cluster runs Serve's {running} ingress but the farm asked for {proxy}: "
            f"start the cluster with {ENV_HAPROXY}={'1' if proxy == 'haproxy' else '0'} "
            f"(see cluster/ and k8s/), or pass --proxy {running}")
