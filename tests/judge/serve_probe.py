"""Run by test_judge_service inside a private network namespace: the real Serve deployment.

argv: a JSON file with a list of JudgeRequest dicts. Prints one JSON line of findings.
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings
from pathlib import Path

import httpx

warnings.simplefilter("ignore")  # Ray's own deprecation noise is not under test here

import ray
from ray import serve

from judge import JudgeConfig
from judge.service import JudgeServiceConfig, judge_app


async def main(path: str) -> None:
    requests = json.loads(Path(path).read_text())
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    config = JudgeServiceConfig(judge=JudgeConfig(use_llm="never"), max_batch_size=16,
                                batch_wait_timeout_s=0.05)
    handle = serve.run(judge_app(config), route_prefix="/")
    verdicts = await asyncio.gather(*(handle.judge.remote(r) for r in requests))
    stats = await handle.stats.remote()
    async with httpx.AsyncClient(base_url="http://127.0.0.1:8000", timeout=60) as client:
        one = (await client.post("/judge", json=requests[0])).json()
        many = (await client.post("/judge", json=requests[:4])).json()
    print("PROBE " + json.dumps({"rewards": [v.reward for v in verdicts], "stats": stats,
                      "http_one": one, "http_many": many}))
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
