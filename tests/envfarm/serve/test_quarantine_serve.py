"""Quarantine on Ray Serve: each pool replica quarantines what the catalog flags; the front's
/quarantine merges them, a lease for the task answers 409 through the front, and a lift reaches
every replica."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import httpx
import pytest

from envfarm.catalog import BUNDLED_CATALOG, load_catalog, verifier_sha256
from tests.envfarm.serve.conftest import ENV, REPLICAS, _start

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def flagged_farm(tmp_path_factory) -> Iterator[object]:
    from envfarm.farm import FarmConfig, PoolConfig, free_port
    from envfarm.serve import DeploymentOptions, ServeOptions

    root = tmp_path_factory.mktemp("flagged")
    shutil.copytree(BUNDLED_CATALOG / ENV, root / ENV)
    (root / "gen_probes.jsonl").write_text(json.dumps({
        "scenario": ENV, "task_idx": 4, "path": "code", "hacked": ["dump"], "undecided": [],
        "summary": "code path: dump", "verifier_sha256": verifier_sha256(load_catalog()[ENV], 4)}) + "\n")
    config = FarmConfig(catalog=str(root), envs=[ENV], pool=PoolConfig(warm=1))
    farm = _start(config, ServeOptions(port=free_port(), num_cpus=2,
                                       deployment=DeploymentOptions(num_replicas=REPLICAS)))
    try:
        yield farm
    finally:
        farm.shutdown()


def test_flagged_task_is_quarantined_on_every_replica_and_lifted_through_the_front(flagged_farm):
    with httpx.Client(base_url=flagged_farm.url, timeout=30) as c:
        (entry,) = c.get("/quarantine").json()
        assert (entry["env"], entry["task_idx"], entry["source"]) == (ENV, 4, "flagged")
        assert len(entry["owners"]) == REPLICAS  # each replica loaded the flag
        refused = c.post(f"/envs/{ENV}/leases", json={"task_idx": 4})
        assert refused.status_code == 409 and refused.json()["error"]["type"] == "TaskQuarantined"
        assert c.post(f"/envs/{ENV}/leases", json={"task_idx": 3}).status_code == 201
        assert [q["task_idx"] for q in c.get("/status.json").json()["quarantined"]] == [4]
        lifted = c.post("/quarantine/lift", json={"env": ENV, "task_idx": 4}).json()
        assert [q["task_idx"] for q in lifted] == [4] and len(lifted[0]["owners"]) == REPLICAS
        assert c.get("/quarantine").json() == []
        for _ in range(2 * REPLICAS):  # whichever replica a lease lands on
            assert c.post(f"/envs/{ENV}/leases", json={"task_idx": 4}).status_code == 201
