"""The model's own success of saved models, as ``envfarm learn`` evaluates it (same jobs).

    python benchmarks/trainer/eval_checkpoints.py runs/learn_s0_long/grpo/checkpoints/step_00011{8,9}

How much does held-out greedy success move between neighbouring GRPO checkpoints? (A learning
run reports its last model's; this shows how much of a difference between runs that is.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    import torch

    from cluster.compose import LocalFarm
    from envfarm.farm import FarmConfig, PoolConfig
    from trainer.hf import load_model
    from trainer.learn import LearnConfig, _eval_jobs, prepare
    from trainer.learn_steps import evaluate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--config", type=Path, default=REPO / "trainer" / "configs" / "learn_cpu.yaml")
    ap.add_argument("--sampled", action="store_true", help="also sampled at T = 1")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = LearnConfig.from_yaml(args.config)
    suite = prepare(cfg, log=lambda _: None)
    jobs = _eval_jobs(cfg, suite)
    rows = []
    with LocalFarm(FarmConfig(catalog=str(suite.catalog), envs=suite.envs,
                              pool=PoolConfig(warm=16))) as farm:
        for path in args.models:
            model, tokenizer = load_model(path, dtype="float32")
            row = {"model": str(path)}
            for mode, temperature in (("greedy", 0.0), ("sampled", 1.0))[:2 if args.sampled else 1]:
                got = asyncio.run(evaluate(
                    farm.url, model, tokenizer, [(e, i) for e, i, _ in jobs], [s for *_, s in jobs],
                    cfg.episode_config(), temperature=temperature,
                    max_new_tokens=cfg.episode.max_new_tokens, seed=cfg.seed, tag=f"grpo:{mode}"))
                row.update({f"{mode}_{split}": round(100 * (v["success_rate"] or 0.0), 1)
                            for split, v in got.items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
