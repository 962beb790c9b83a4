"""What the local multi-node cluster takes from k8s/rayservice.yaml, and the only changes it makes
to the manifest's Serve config (no Ray started)."""

from __future__ import annotations

import copy
import subprocess
import sys

from cluster.local_cluster import (
    MANIFEST,
    fit_to_machine,
    head_group,
    load_manifest,
    manifest_serve_config,
    pod_env,
    worker_group,
)
from cluster.serve._ingress import farm_env


def test_nodes_get_the_pods_environment():
    manifest = load_manifest()
    for group in (head_group(manifest), worker_group(manifest)):
        assert pod_env(group) == farm_env("haproxy")  # the ingress mode and all its tuning
    assert head_group(manifest)["rayStartParams"]["num-cpus"] == "0"


def test_fit_to_machine_changes_only_what_it_lists():
    config = manifest_serve_config(load_manifest())
    original = copy.deepcopy(config)
    fast = {"min_replicas": 2, "max_replicas": 3, "upscale_delay_s": 1.0}
    out = fit_to_machine(config, envs=["hotel_booking_1"], port=18000, autoscaling=fast)
    assert config == original  # a copy, not an edit
    assert out["http_options"] == {"host": "127.0.0.1", "port": 18000}
    names = [a["name"] for a in out["applications"]]
    assert names == ["env-hotel_booking_1", "envfarm"]
    pool, front = out["applications"]
    kept = next(a for a in original["applications"] if a["name"] == "env-hotel_booking_1")
    assert pool["import_path"] == kept["import_path"] and pool["route_prefix"] == kept["route_prefix"]
    assert pool["args"]["farm"] == kept["args"]["farm"]
    deployment = pool["args"]["deployment"]
    assert deployment["num_cpus"] == 1.0  # the manifest's placement, untouched
    assert deployment["autoscaling_config"] == {**kept["args"]["deployment"]["autoscaling_config"],
                                                **fast}
    assert front["args"]["routes"] == {"hotel_booking_1": ["env-hotel_booking_1", "pool"]}
    assert front["args"]["replicas"] == {"env-hotel_booking_1": 3}  # the front asks up to max
    every = fit_to_machine(config, envs=None, port=18000)
    assert [a["name"] for a in every["applications"]] == [a["name"] for a in original["applications"]]


def test_the_script_runs_for_a_person():
    out = subprocess.run([sys.executable, "cluster/local_cluster.py", "--help"],
                         cwd=MANIFEST.parents[1], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "--workers" in out.stdout and "--run" in out.stdout
