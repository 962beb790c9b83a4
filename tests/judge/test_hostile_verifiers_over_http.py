"""Hostile verifiers in a catalog, driven through the farm's HTTP API (issue 20, item 7): the
old shared worker let a verifier answer "complete" for other leases, so a lease that did
nothing scored 1.0. Now each verification has its own process and its own reply pipe."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from cluster.compose import LocalFarm
from envfarm.client import Farm
from envfarm.confined.jail import support
from envfarm.farm import FarmConfig, PoolConfig

pytestmark = pytest.mark.skipif(not support().ok, reason=f"kernel lacks: {support().describe()}")

BUNDLED = Path(__file__).resolve().parents[2] / "envfarm" / "catalog" / "hotel_booking_1"
SECRET = "sk-front-secret-7777"
OS = ("    g = [c for c in ().__class__.__base__.__subclasses__()"
      " if c.__name__ == '_wrap_close'][0].__init__.__globals__\n")
FORGED = json.dumps({"ok": True, "result_json": json.dumps({"result": "complete"})})

HOSTILE = {
    # Writes a forged "complete" reply on every descriptor, again and again, while the
    # honest verifications of other leases run beside it.
    0: OS + f"""    frame = len({FORGED!r}).to_bytes(4, 'big') + {FORGED!r}.encode()
    import time
    end = time.time() + 0.3
    while time.time() < end:
        for fd in range(3, 256):
            try:
                g['write'](fd, frame)
            except OSError:
                pass
    return {{'result': 'others'}}
""",
    # Tries to kill the zygote, then the front.
    2: OS + """    g['kill'](g['getppid'](), 9)
    g['kill'](FRONT, 9)
    return {'result': 'complete'}
""",
    # Reads the front's environment (the farm holds API keys there) and returns it.
    3: OS + """    return {'result': 'complete',
            'env': g['sys'].modules['builtins'].open(f'/proc/{FRONT}/environ').read()}
""",
}


@pytest.fixture
def hostile_catalog(tmp_path: Path) -> Path:
    import os

    env = tmp_path / "hotel_booking_1"
    shutil.copytree(BUNDLED, env)
    path = env / "gen_verifier.pure_code.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in records:
        body = HOSTILE.get(rec["task_idx"])
        if body is not None:
            rec["verification"]["code"] = (
                "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n"
                + body.replace("FRONT", str(os.getpid())))
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def test_hostile_verifiers_cannot_touch_other_leases_or_the_farm(hostile_catalog, monkeypatch):
    monkeypatch.setenv("ENVFARM_FRONT_SECRET", SECRET)
    config = FarmConfig(catalog=str(hostile_catalog), envs=["hotel_booking_1"],
                        pool=PoolConfig(warm=4), verifier_workers=4, verifier_timeout_s=20)

    async def main(url: str) -> None:
        async with Farm(url) as farm:
            async with farm.lease("hotel_booking_1", task_idx=0) as forger, \
                    farm.lease("hotel_booking_1", task_idx=1) as idle:
                rounds = await asyncio.gather(*(
                    (forger if i % 2 == 0 else idle).verify() for i in range(12)))
                honest = rounds[1::2]
                # The idle lease did nothing: its own verifier says so, every time.
                assert all(v.valid and v.reward == 0.0 for v in honest), honest
            for task in (2, 3):
                async with farm.lease("hotel_booking_1", task_idx=task) as lease:
                    verdict = await lease.verify()
                    assert not verdict.valid and verdict.reward is None, verdict
                    assert SECRET not in json.dumps(verdict.model_dump(mode="json"))
            async with farm.lease("hotel_booking_1", task_idx=1) as after:
                verdict = await after.verify()  # the farm and its verifiers serve on
                assert verdict.valid and verdict.reward == 0.0, verdict

    with LocalFarm(config) as farm:
        asyncio.run(main(farm.url))
