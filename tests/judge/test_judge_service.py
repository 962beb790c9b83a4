"""The judge service: POST /judge in process, and the Serve deployment batching requests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from judge import Judge, JudgeConfig, JudgeRequest, VerifierCode
from judge.http import create_app


def code_request(case, final: bytes, rid: str) -> dict:
    req = JudgeRequest(id=rid, task=case.task, verifier=VerifierCode(code=case.code["code"]),
                       initial_db_b64=case.initial, final_db_b64=final)
    return json.loads(req.model_dump_json())


@pytest.fixture
async def client(sandbox):
    judge = Judge(JudgeConfig(use_llm="never"), sandbox=sandbox)
    transport = httpx.ASGITransport(app=create_app(judge))
    async with httpx.AsyncClient(transport=transport, base_url="http://judge") as c:
        yield c
    await judge.aclose()


async def test_post_one(client, awm_cases):
    case = awm_cases[1]
    res = await client.post("/judge", json=code_request(case, case.solved, "a"))
    assert res.status_code == 200
    body = res.json()
    assert body["id"] == "a"
    assert body["verdict"]["outcome"] == "completed" and body["verdict"]["reward"] == 1.0


async def test_post_many_keeps_order(client, awm_cases):
    case = awm_cases[2]
    body = [code_request(case, case.solved, "s"), code_request(case, case.initial, "n")]
    res = await client.post("/judge", json=body)
    out = res.json()
    assert [o["id"] for o in out] == ["s", "n"]
    assert [o["verdict"]["reward"] for o in out] == [1.0, 0.0]


async def test_invalid_is_null_on_the_wire(client, awm_cases):
    case = awm_cases[2]
    req = code_request(case, case.solved, "x")
    req["verifier"] = {"code": case.sql["code"]}  # the broken one
    out = (await client.post("/judge", json=req)).json()["verdict"]
    assert out["reward"] is None and out["valid"] is False and out["outcome"] == "invalid"


async def test_bad_request_is_422(client):
    res = await client.post("/judge", json={"verifier": {"code": "x"}})
    assert res.status_code == 422 and res.json()["kind"] == "invalid_request"
    assert (await client.get("/healthz")).json()["mode"] == "code"


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="needs a private network namespace (root + unshare)")
def test_serve_deployment_batches(awm_cases, tmp_path):
    # A real Ray cluster and Serve HTTP proxy, inside their own network namespace.
    case = awm_cases[1]
    reqs = [code_request(case, case.solved if i % 2 else case.initial, str(i)) for i in range(32)]
    (tmp_path / "reqs.json").write_text(json.dumps(reqs))
    probe = Path(__file__).with_name("serve_probe.py")
    cmd = f"ip link set lo up && exec {sys.executable} {probe} {tmp_path / 'reqs.json'}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run(["unshare", "--net", "sh", "-c", cmd], capture_output=True, text=True,
                          timeout=240, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if x.startswith("PROBE ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads(lines[-1][len("PROBE "):])
    assert out["rewards"] == [1.0 if i % 2 else 0.0 for i in range(32)]
    assert out["stats"]["requests"] == 32
    assert out["stats"]["batches"] < 32 and out["stats"]["max_batch"] > 1  # it batched
    assert out["http_one"]["verdict"]["reward"] == 0.0 and out["http_one"]["id"] == "0"
    assert [m["verdict"]["reward"] for m in out["http_many"]] == [0.0, 1.0, 0.0, 1.0]
