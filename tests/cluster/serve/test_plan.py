"""Laying out apps and reading owners from requests (no Ray started)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from cluster.serve import ServeOptions, owner_from_path, plan
from cluster.serve._router import owner_of_request
from envfarm.farm import FarmConfig


def test_one_app_per_env_or_packs(bundled_catalog):
    config = FarmConfig()
    apps = plan(config, ServeOptions(), bundled_catalog)
    assert [a.route_prefix for a in apps] == [f"/envs/{e}" for e in bundled_catalog.servable]
    packed = plan(config, ServeOptions(pack=2), bundled_catalog)
    assert [len(a.envs) for a in packed] == [2, 1]
    assert all(a.route_prefix is None for a in packed)
    with pytest.raises(ValueError):
        ServeOptions(pack=2, per_env={"x": {"num_replicas": 2}})


def test_on_demand_types_share_one_deployment(bundled_catalog):
    """Types loaded on demand keep their code in workers: one deployment holds them all
    (not an application each); an explicit --pack still wins."""
    config = FarmConfig(on_demand=True)
    apps = plan(config, ServeOptions(), bundled_catalog)
    assert [(a.envs, a.route_prefix) for a in apps] == [(bundled_catalog.servable, None)]
    assert [len(a.envs) for a in plan(config, ServeOptions(pack=2), bundled_catalog)] == [2, 1]


def test_owner_from_path():
    assert owner_from_path("/envs/a/leases/abc123-00ff/call") == "abc123"
    assert owner_from_path("/envs/a/leases/abc123-00ff") == "abc123"
    assert owner_from_path("/envs/a/leases/nodash") is None  # not a lease id
    assert owner_from_path("/envs/a/leases") is None
    assert owner_from_path("/envs/a") is None


def test_owner_of_a_proxied_http_request():
    from ray.serve._private.common import StreamingHTTPRequest

    arg = pickle.dumps(StreamingHTTPRequest(asgi_scope={"path": "/envs/e/leases/r1-0a/tools"},
                                            proxy_actor_name="p"))
    assert owner_of_request(SimpleNamespace(args=[arg], kwargs={})) == "r1"
    assert owner_of_request(SimpleNamespace(args=[], kwargs={"owner": "r2"})) == "r2"
    assert owner_of_request(SimpleNamespace(args=[b"junk"], kwargs={})) is None


def test_new_leases_spread_even_with_stale_stats():
    from cluster.serve import LeaseRouter

    def replica(uid: str, leases: int) -> SimpleNamespace:
        return SimpleNamespace(replica_id=SimpleNamespace(unique_id=uid),
                               routing_stats={"leases": leases})

    router = LeaseRouter.__new__(LeaseRouter)  # no Serve plumbing needed for this method
    a, b = replica("a", 0), replica("b", 3)
    picks = [router._least_loaded([a, b])[0].replica_id.unique_id for _ in range(9)]
    assert picks[:3] == ["a", "a", "a"]  # a was emptier ...
    assert picks.count("b") >= 3  # ... but not for ever, though its stats did not move




def test_door_replicas_in_front_of_a_multi_replica_pool(bundled_catalog):
    from ray.serve._private.build_app import build_app  # Serve's own builder; no Ray started

    from cluster.serve import DeploymentOptions
    from cluster.serve._ingress import pool_application

    farm = FarmConfig(envs=["hotel_booking_1"]).model_dump()
    built = build_app(pool_application(farm, DeploymentOptions(num_replicas=2, door_replicas=3),
                                       "haproxy"), name="a")
    assert built.ingress_deployment_name == "door"
    assert {d.name: d.num_replicas for d in built.deployments} == {"pool": 2, "door": 3}
    single = build_app(pool_application(farm, DeploymentOptions(door_replicas=3), "haproxy"),
                       name="b")
    assert [d.name for d in single.deployments] == ["pool"]  # one replica is its own ingress


def test_the_door_takes_the_http_hop_unless_the_pool_autoscales(bundled_catalog):
    """Serve's autoscaler counts the requests its handles route: an autoscaled pool behind a
    Door that bypassed them (the HTTP hop) would never scale up."""
    from pydantic import ValidationError

    from cluster.serve import DeploymentOptions
    from cluster.serve._ingress import pool_application

    farm = FarmConfig(envs=["hotel_booking_1"]).model_dump()
    auto = {"min_replicas": 1, "max_replicas": 2}

    def hop(**options) -> str:
        door = pool_application(farm, DeploymentOptions(**options), "haproxy")
        return door._bound_deployment.init_args[2]

    assert hop(num_replicas=2) == "http"
    assert hop(num_replicas=2, door_hop="handle") == "handle"
    assert hop(autoscaling_config=auto) == "handle"
    with pytest.raises(ValidationError, match="autoscaling"):
        DeploymentOptions(autoscaling_config=auto, door_hop="http")
