"""Do the two reward paths score a model's OWN episodes alike? One verdict each, same episode.

    python benchmarks/trainer/judge_vs_code.py --model runs/learn_s0/model_sft --tasks 64 --samples 4

The model's sampled episodes (T = 1) on train tasks of the learning suite; each episode that
reaches the verify step is scored by the farm's code verifier (``lease.verify``) AND by the
judge path (``trainer/judging.py``, the faithful mock judge of ``tests/fakes/faithful_judge.py``)
on the same lease, final answer and trajectory. Prints the outcome pairs and each disagreement.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.fakes.faithful_judge import verdict_of  # noqa: E402
from tests.fakes.mock_openai import MockOpenAI  # noqa: E402


async def compare(farm_url: str, catalog, model, tokenizer, jobs, cfg, judge_url: str, seed: int):
    from envfarm.client import Farm
    from envfarm.verdict import RewardConfig
    from trainer.batched import BatchedPolicy, run_lockstep
    from trainer.judging import EpisodeJudge, settle

    pairs: list[dict] = []

    class BothWays(EpisodeJudge):
        async def submit(self, lease, env, task_idx, trajectory, final_answer):
            code = await lease.verify(task_idx, final_answer, trajectory)
            future = await super().submit(lease, env, task_idx, trajectory, final_answer)
            row = {"env": env, "task_idx": task_idx, "code": getattr(code.outcome, "value", code.outcome),
                   "code_reason": code.reason, "answer": final_answer}
            pairs.append(row)
            future.add_done_callback(lambda f: row.update(judge=f.result().outcome.value,
                                                          judge_reason=f.result().reason))
            return future

    judge = BothWays.create(catalog, RewardConfig(path="llm", llm_base_url=judge_url,
                                                  llm_model="mock-judge"))
    episode_cfg = dataclasses.replace(cfg.episode_config(), judge=judge)
    policy = BatchedPolicy(model, tokenizer, max_new_tokens=cfg.episode.max_new_tokens,
                           temperature=1.0, seed=seed, max_batch=64)
    async with Farm(farm_url, max_connections=128) as farm:
        results = []
        for start in range(0, len(jobs), 128):
            results += await run_lockstep(farm, policy, jobs[start:start + 128],
                                          config=episode_cfg, tag=("vs", start))
        await settle(results)
    await judge.aclose()
    return results, pairs


def main() -> None:
    from cluster.compose import LocalFarm
    from envfarm import load_catalog
    from envfarm.farm import FarmConfig, PoolConfig
    from trainer.hf import load_model
    from trainer.learn import LearnConfig, prepare

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=REPO / "trainer" / "configs" / "learn_cpu.yaml")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--split", default="train", choices=["train", "heldout"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    cfg = LearnConfig.from_yaml(args.config)
    suite = prepare(cfg, log=lambda _: None)
    catalog = load_catalog(suite.catalog)
    pool = suite.jobs(args.split)
    tasks = sorted(random.Random(args.seed).sample(pool, min(args.tasks, len(pool))))
    jobs = [job for job in tasks for _ in range(args.samples)]
    model, tokenizer = load_model(args.model, dtype="float32")
    with MockOpenAI() as mock:
        mock.script(verdict_of, stage="judge", repeat=True)
        with LocalFarm(FarmConfig(catalog=str(suite.catalog), envs=suite.envs,
                                  pool=PoolConfig(warm=16))) as farm:
            results, pairs = asyncio.run(compare(farm.url, catalog, model, tokenizer, jobs, cfg,
                                                 mock.url, args.seed))
    table = Counter((p["code"], p.get("judge")) for p in pairs)
    differ = [p for p in pairs if p["code"] != p.get("judge")]
    report = {"model": str(args.model), "split": args.split, "episodes": len(results),
              "verified": len(pairs), "ends": dict(Counter(r.end.value for r in results)),
              "pairs": {f"{c} / {j}": n for (c, j), n in table.most_common()},
              "disagree": len(differ), "disagreements": differ}
    print(json.dumps({k: v for k, v in report.items() if k != "disagreements"}, indent=1))
    for p in differ[:20]:
        print(json.dumps(p)[:600])
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
