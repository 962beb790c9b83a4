"""A multi-node Ray cluster on this one machine, laid out and deployed as k8s/rayservice.yaml is.

Each node is its own raylet (Ray's ``cluster_utils.Cluster``: own resources, ports and
processes), started with the environment the manifest gives its pod (Serve's HAProxy ingress and
the farm's tuning) plus the ports that must differ when nodes share one network namespace. The
farm is then deployed the way KubeRay deploys a RayService: the manifest's ``serveConfigV2`` is
PUT to the head's dashboard at ``/api/serve/applications/``. Only sizes are scaled to the
machine (``fit_to_machine``, every change listed there).

Run it (inside a private network namespace: every port is on loopback only):

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python cluster/local_cluster.py \\
        --workers 3 --envs hotel_booking_1 --run "curl -s $ENVFARM_INGRESS_0/envs"'

Without ``--run`` it prints every node's ingress and holds the cluster until Ctrl-C. The pytest
fixture of tests/cluster/serve/test_multinode.py and benchmarks/serve/bench_multinode.py use the same
functions.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "k8s" / "rayservice.yaml"
#: The tenant a local cluster's farm knows (the k8s Secret names the real ones).
LOCAL_TENANT = "local"
#: Serve stops a direct-ingress replica this long after its last request so outside load
#: balancers can drop it (30 s by default). Here the only balancer is each node's HAProxy,
#: which reloads in well under a second (as cluster/serve/_run.py does on one node).
LOCAL_DRAIN = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}


#: Ports handed to the nodes come from below the kernel's ephemeral range (32768-60999 here) and
#: above Ray's worker ports (10002-19999): a port the kernel picked (bind to 0) is free now but may
#: be given to one of Ray's own sockets before HAProxy binds it, which crashed a node's HAProxy
#: ("Address already in use" on its stats port) and left that node without an ingress.
_NODE_PORTS = range(20000, 32000)
_handed_out: set[int] = set()


def free_port() -> int:
    """A port free on loopback now, outside the ranges the kernel and Ray pick from, and never
    the same twice in this process."""
    start = random.randrange(len(_NODE_PORTS))
    for i in range(len(_NODE_PORTS)):
        port = _NODE_PORTS[(start + i) % len(_NODE_PORTS)]
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {_NODE_PORTS.start}-{_NODE_PORTS.stop - 1}")


# -- what the manifest says ---------------------------------------------------------------------
def load_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def manifest_serve_config(manifest: dict[str, Any]) -> dict[str, Any]:
    """The RayService's ``serveConfigV2``: what KubeRay PUTs to the head's dashboard."""
    return yaml.safe_load(manifest["spec"]["serveConfigV2"])


def _container(group: dict[str, Any]) -> dict[str, Any]:
    return group["template"]["spec"]["containers"][0]


def pod_env(group: dict[str, Any]) -> dict[str, str]:
    """The environment a node group's pods run with (Serve's ingress mode and its tuning).
    Values from a Secret (``valueFrom``: the tenants' keys) are the cluster's to give:
    ``start_cluster`` makes its own."""
    return {e["name"]: str(e["value"]) for e in _container(group).get("env", []) if "value" in e}


def head_group(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["rayClusterConfig"]["headGroupSpec"]


def worker_group(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]


def fit_to_machine(config: dict[str, Any], *, envs: list[str] | None, port: int,
                   autoscaling: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest's Serve config scaled to this machine; everything else stays as written.

    - ``http_options``: 127.0.0.1 and a free port (the manifest: 0.0.0.0:8000 in a pod);
    - ``envs``: only these envs' apps, and the front's routes to them (None: all);
    - ``autoscaling``: merged into each kept app's ``autoscaling_config`` (tests scale fast).
    """
    out = copy.deepcopy(config)
    out["http_options"] = {**out.get("http_options", {}), "host": "127.0.0.1", "port": port}
    kept = []
    for app in out["applications"]:
        farm = app["args"]["farm"]
        if app["route_prefix"] == "/":
            if envs is not None:
                routes = {e: r for e, r in app["args"]["routes"].items() if e in envs}
                apps = {r[0] for r in routes.values()}
                app["args"]["routes"] = routes
                app["args"]["replicas"] = {a: n for a, n in app["args"]["replicas"].items()
                                           if a in apps}
        elif envs is not None and not set(farm.get("envs", [])) & set(envs):
            continue
        elif autoscaling and "autoscaling_config" in app["args"].get("deployment", {}):
            deployment = app["args"]["deployment"]
            deployment["autoscaling_config"] = {**deployment["autoscaling_config"],
                                                **autoscaling}
        kept.append(app)
    out["applications"] = kept
    front = next(a for a in kept if a["route_prefix"] == "/")
    for app in kept:  # the front asks every replica for status and metrics: its max count
        scaling = app["args"].get("deployment", {}).get("autoscaling_config")
        if scaling and app["name"] in front["args"]["replicas"]:
            front["args"]["replicas"][app["name"]] = scaling["max_replicas"]
    return out


# -- the cluster --------------------------------------------------------------------------------
@dataclass
class LocalNode:
    """One raylet of the local cluster and the port its HAProxy ingress listens on."""

    node: Any  # ray._private.node.Node
    port: int
    head: bool = False

    @property
    def node_id(self) -> str:
        return self.node.node_id

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class LocalCluster:
    """Ray nodes on this machine: a head (controller, HAProxy, dashboard) and workers."""

    cluster: Any  # ray.cluster_utils.Cluster
    head: LocalNode
    workers: list[LocalNode] = field(default_factory=list)
    dashboard_url: str = ""
    worker_env: dict[str, str] = field(default_factory=dict)
    worker_cpus: int = 1
    config: dict[str, Any] | None = None  # the Serve config deployed last
    api_key: str = ""  # the one tenant's key (the manifest's Secret, made up here)

    @property
    def key_header(self) -> dict[str, str]:
        """What a client sends to create leases on this cluster's farm."""
        return {"X-Envfarm-Key": self.api_key}

    @property
    def nodes(self) -> list[LocalNode]:
        return [self.head, *self.workers]

    def by_id(self, node_id: str) -> LocalNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def add_worker(self) -> LocalNode:
        """A new worker node, as KubeRay adds a pod to the worker group."""
        port = free_port()
        env = {**self.worker_env, **_node_ports(), "RAY_SERVE_WORKER_PROXY_HTTP_PORT": str(port)}
        node = self.cluster.add_node(num_cpus=self.worker_cpus, env_vars=env)
        worker = LocalNode(node, port)
        self.workers.append(worker)
        return worker

    def kill_worker(self, worker: LocalNode) -> None:
        """SIGKILL every process of a worker node (raylet and all; its actors die with it)."""
        self.cluster.remove_node(worker.node, allow_graceful=False)
        self.workers.remove(worker)

    def shutdown(self) -> None:
        import ray
        from ray import serve

        # Serve first: it stops this driver's DeploymentHandles, whose metrics pushes would
        # otherwise reconnect Ray by themselves (auto-init) after ray.shutdown, and a driver
        # attached to the head blocks the head's removal.
        if ray.is_initialized():
            serve.shutdown()
        ray.shutdown()
        self.cluster.shutdown()


def _node_ports() -> dict[str, str]:
    """Ports each HAProxy binds besides its ingress: distinct per node on one machine."""
    return {"RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port())}


def start_cluster(workers: int = 3, *, worker_cpus: int = 1, head_cpus: int | None = None,
                  port: int | None = None, manifest: dict[str, Any] | None = None,
                  system_config: dict[str, Any] | None = None) -> LocalCluster:
    """Head + ``workers`` worker nodes with the manifest's node environments; the driver (this
    process) connects to the head. ``head_cpus``: None is the manifest's (0: no pool replicas
    on the head); ``system_config``: Ray's (e.g. faster node-death checks)."""
    import ray
    from ray.cluster_utils import Cluster

    from envfarm.farm import new_key

    manifest = manifest or load_manifest()
    head_params = head_group(manifest)["rayStartParams"]
    api_key = new_key()
    tenants = {"ENVFARM_API_KEYS": f"{LOCAL_TENANT}:{api_key}"}  # what the Secret holds in k8s
    head_env = {**pod_env(head_group(manifest)), **tenants, **LOCAL_DRAIN, **_node_ports()}
    dashboard_port = free_port()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": int(head_params.get("num-cpus", 0)) if head_cpus is None else head_cpus,
        "env_vars": head_env,
        "include_dashboard": True, "dashboard_host": "127.0.0.1",
        "dashboard_port": dashboard_port, "_system_config": system_config or {}})
    local = LocalCluster(cluster=cluster, head=LocalNode(cluster.head_node, port or free_port(),
                                                         head=True),
                         dashboard_url=f"http://127.0.0.1:{dashboard_port}",
                         worker_env={**pod_env(worker_group(manifest)), **tenants,
                                     **LOCAL_DRAIN},
                         worker_cpus=worker_cpus, api_key=api_key)
    try:
        for _ in range(workers):
            local.add_worker()
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    except BaseException:
        cluster.shutdown()
        raise
    return local


def deploy(cluster: LocalCluster, config: dict[str, Any], envs: list[str] | None = None,
           timeout_s: float = 240) -> None:
    """Deploy a Serve config as KubeRay does (PUT to the head's dashboard), wait until its apps
    run and every node's ingress serves ``envs`` (HAProxy learns routes a moment later)."""
    body = json.dumps(config).encode()
    deadline = time.monotonic() + timeout_s
    while True:  # the dashboard's Serve module comes up a little after the head
        req = urllib.request.Request(cluster.dashboard_url + "/api/serve/applications/",
                                     data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as res:
                if res.status == 200:
                    break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the dashboard did not take the config: {exc}") from exc
        time.sleep(1.0)
    wait_running([a["name"] for a in config["applications"]], deadline)
    cluster.config = config
    wait_ingress(cluster, ["/healthz", *(f"/envs/{e}" for e in envs or [])], deadline)


def wait_running(apps: list[str], deadline: float) -> None:
    from ray import serve

    while True:
        status = serve.status().applications
        states = {a: getattr(status.get(a), "status", "MISSING") for a in apps}
        if all(s == "RUNNING" for s in states.values()):
            return
        if any(s in ("DEPLOY_FAILED", "UNHEALTHY") for s in states.values()):
            raise RuntimeError(f"deploy failed: { {a: status[a].message for a in apps} }")
        if time.monotonic() > deadline:
            raise TimeoutError(f"apps not running in time: {states}")
        time.sleep(0.5)


def ingress_nodes(cluster: LocalCluster) -> list[LocalNode]:
    """Nodes whose HAProxy runs: Serve starts one on each node that holds a replica, the head
    included only when it holds one (KubeRay's serve service likewise selects only the pods
    whose proxy is healthy)."""
    from ray import serve

    proxies = serve.status().proxies
    return [n for n in cluster.nodes if proxies.get(n.node_id) == "HEALTHY"]


def wait_ingress(cluster: LocalCluster, paths: list[str], deadline: float) -> None:
    """Until every node holding a replica runs a healthy HAProxy that serves ``paths``."""
    while True:
        holding = actor_nodes("SERVE_REPLICA::")
        ready = {n.node_id for n in ingress_nodes(cluster)}
        if holding <= ready:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"no healthy ingress on nodes {sorted(holding - ready)}")
        time.sleep(0.5)
    pending = {(n.url, p) for n in ingress_nodes(cluster) for p in paths}
    while pending:
        for url, path in sorted(pending):
            try:
                with urllib.request.urlopen(url + path, timeout=10) as res:
                    if res.status == 200:
                        pending.discard((url, path))
            except OSError:
                pass
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"ingress not serving: {sorted(pending)}")
        time.sleep(0.5)


def actor_nodes(prefix: str) -> set[str]:
    """Node ids of the live actors whose name starts with ``prefix`` (Serve names a replica
    ``SERVE_REPLICA::<app>#<deployment>#<id>``)."""
    from ray.util.state import list_actors

    return {a.node_id for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
            if (a.name or "").startswith(prefix)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--worker-cpus", type=int, default=1)
    parser.add_argument("--head-cpus", type=int, default=None,
                        help="default: the manifest's (0: the head runs no pool replica)")
    parser.add_argument("--port", type=int, default=8000, help="the head node's ingress")
    parser.add_argument("--envs", default=None, help="comma-separated; default: the manifest's")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--run", default=None,
                        help="a shell command to run against the cluster, then tear it down "
                             "(ENVFARM_INGRESS_<i> holds node i's URL, 0 is the head; "
                             "ENVFARM_API_KEY the key that may create leases)")
    args = parser.parse_args(argv)
    manifest = load_manifest(args.manifest)
    envs = args.envs.split(",") if args.envs else None
    t0 = time.monotonic()
    cluster = start_cluster(args.workers, worker_cpus=args.worker_cpus,
                            head_cpus=args.head_cpus, port=args.port, manifest=manifest)
    try:
        config = fit_to_machine(manifest_serve_config(manifest), envs=envs, port=args.port)
        served = [e for a in config["applications"] for e in a["args"]["farm"].get("envs", [])]
        deploy(cluster, config, envs=served)
        print(f"cluster up in {time.monotonic() - t0:.1f} s; dashboard {cluster.dashboard_url}")
        urls = {"ENVFARM_API_KEY": cluster.api_key}  # the SDK's variable: the tenant's key
        for i, node in enumerate(cluster.nodes):
            urls[f"ENVFARM_INGRESS_{i}"] = node.url
            print(f"  node {i} {'head  ' if node.head else 'worker'} {node.node_id[:12]} "
                  f"ingress {node.url}")
        if args.run:
            return subprocess.run(args.run, shell=True, env={**os.environ, **urls},
                                  check=False).returncode
        print(f"  tenant {LOCAL_TENANT!r}: export ENVFARM_API_KEY={cluster.api_key}")
        print("Ctrl-C to stop")
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
