"""The KubeRay manifest: valid against the RayService schema subset, and its Serve config is
exactly what the farm's own builders accept and would write."""

from __future__ import annotations

import importlib
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
MANIFEST = REPO / "k8s" / "rayservice.yaml"
SCHEMA = REPO / "k8s" / "rayservice.schema.json"


@pytest.fixture(scope="module")
def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def test_manifest_matches_rayservice_schema(manifest):
    import json

    import jsonschema

    jsonschema.validate(manifest, json.loads(SCHEMA.read_text()))
    cli = shutil.which("check-jsonschema") or str(Path(__import__("sys").executable).parent /
                                                  "check-jsonschema")
    if not Path(cli).exists():
        pytest.skip("check-jsonschema is not installed")
    out = subprocess.run([cli, "--schemafile", str(SCHEMA), str(MANIFEST)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_serve_config_builds_with_the_farm_builders(manifest, bundled_catalog):
    from cluster.serve.apps import FrontAppArgs, PoolAppArgs

    config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    apps = config["applications"]
    prefixes = [a.get("route_prefix") for a in apps]
    assert len(set(prefixes)) == len(prefixes) and "/" in prefixes
    served = set()
    for app in apps:
        module, _, name = app["import_path"].partition(":")
        assert callable(getattr(importlib.import_module(module), name))
        if app["name"] == "envfarm":
            front = FrontAppArgs.model_validate(app["args"])
            assert set(front.routes) == served
        else:
            pool = PoolAppArgs.model_validate(app["args"])
            assert app["route_prefix"] == f"/envs/{pool.farm.envs[0]}"
            served.update(pool.farm.envs)
    assert served == set(bundled_catalog.servable)


def test_manifest_is_what_serve_config_writes(manifest):
    from cluster.serve import DeploymentOptions, ServeOptions
    from cluster.serve.apps import serve_config
    from envfarm.farm import FarmConfig, PoolConfig

    # A pool replica reserves one CPU: one event loop uses at most a core, and a replica that
    # cannot be placed is the demand KubeRay's autoscaler answers with a new worker pod.
    options = ServeOptions(
        host="0.0.0.0", deployment=DeploymentOptions(num_replicas=2, num_cpus=1),
        per_env={"hotel_booking_1": DeploymentOptions(num_cpus=1, autoscaling_config={
            "min_replicas": 2, "max_replicas": 8, "target_ongoing_requests": 64})})
    written = serve_config(FarmConfig(pool=PoolConfig(warm=16)), options)
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"]) == written


def test_deployed_farm_takes_its_tenants_from_the_pods_secret(manifest, monkeypatch):
    """Listening on 0.0.0.0, every app requires a key; both node groups get the keys from the
    Secret, and a replica built without any refuses to deploy (an open farm on a cluster's
    network is the mistake this prevents)."""
    from cluster.serve import ServeOptions
    from cluster.serve.apps import PoolAppArgs, _with_tenants, serve_config
    from envfarm.errors import ConfigError
    from envfarm.farm import FarmConfig, hash_key

    apps = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    assert all(a["args"]["farm"]["tenants"]["require_key"] is True for a in apps)
    cluster = manifest["spec"]["rayClusterConfig"]
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        env = {e["name"]: e for e in group["template"]["spec"]["containers"][0]["env"]}
        assert env["ENVFARM_API_KEYS"]["valueFrom"]["secretKeyRef"] == {
            "name": "envfarm-tenants", "key": "api-keys"}
    farm = PoolAppArgs.model_validate(apps[0]["args"]).farm
    for var in ("ENVFARM_API_KEYS", "ENVFARM_TENANTS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="ENVFARM_API_KEYS"):
        _with_tenants(farm)
    monkeypatch.setenv("ENVFARM_API_KEYS", "alpha:efk_a,beta:efk_b")
    tenants = _with_tenants(farm).tenants
    assert tenants.require_key and [(t.name, t.key_sha256) for t in tenants.tenants] == [
        ("alpha", hash_key("efk_a")), ("beta", hash_key("efk_b"))]
    monkeypatch.setenv("ENVFARM_API_KEYS", "alpha:efk_a,alpha:efk_c")
    with pytest.raises(ConfigError, match="unique"):
        _with_tenants(farm)
    local = serve_config(FarmConfig(envs=["hotel_booking_1"]), ServeOptions(host="127.0.0.1"))
    assert all("tenants" not in a["args"]["farm"] for a in local["applications"])  # stays open


def test_cluster_scripts_and_launcher_config():
    cluster = REPO / "cluster"
    for script in ("start_head.sh", "start_worker.sh"):
        out = subprocess.run(["bash", "-n", str(cluster / script)], check=False,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "ray start" in (cluster / script).read_text()
    launcher = yaml.safe_load((cluster / "ray-cluster.yaml").read_text())
    assert launcher["provider"]["type"] == "local"
    assert {"head_start_ray_commands", "worker_start_ray_commands"} <= set(launcher)
