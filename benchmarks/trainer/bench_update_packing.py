"""The GRPO update on real rollouts, packed against unpacked, side by side in one process.

    python benchmarks/trainer/bench_update_packing.py --model runs/learn_mixed_whole_s3/model_sft \\
        --config trainer/configs/learn_cpu_mixed.yaml --batches 2 --rounds 3 \\
        --json benchmarks/results/update_packing.json

A learn run's SFT model plays ``--batches`` GRPO rollout steps against a local farm (the
config's groups, temperatures and episode loop; the learning run's first steps), then each
batch is updated ``--rounds`` times by each variant, alternating which goes first, each time
from the same weights and optimizer state: ``packed`` (``trainer.grpo``'s update: an
episode's turns share a row, rows of like length share a micro-batch) and ``unpacked``
(``GRPOConfig(pack=False)``: one row per sample, micro-batches in mini-batch order, the
update before packing). Reported: the median seconds per update of each, their ratio, the
tokens each forward scored, and the largest difference between the two updates' losses and
weights (the same step, summed in another order).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


async def _batches(trainer, n: int) -> list[list]:
    from trainer.train import rollout_samples

    out = []
    for step in range(n):
        samples, _ = rollout_samples(await trainer.rollouts(step), trainer.tokenizer)
        out.append(samples)
    return out


def _update(trainer, samples, pack: bool, step: int) -> tuple[float, dict, dict]:
    import torch

    from trainer.grpo import grpo_step

    model = copy.deepcopy(trainer.model)
    opt = torch.optim.AdamW(model.parameters(), lr=trainer.optimizer.param_groups[0]["lr"],
                            weight_decay=0.0)
    cfg = dataclasses.replace(trainer.grpo_cfg, pack=pack, seed=trainer.cfg.seed * 1_000_003 + step)
    started = time.perf_counter()
    stats = grpo_step(model, trainer.ref, opt, samples, trainer.tokenizer.pad_token_id, cfg)
    return time.perf_counter() - started, stats, dict(model.named_parameters())


def main() -> None:
    from cluster.compose import LocalFarm
    from envfarm.farm import FarmConfig, PoolConfig
    from trainer.learn import LearnConfig, machine, prepare
    from trainer.packing import pack as pack_rows
    from trainer.train import Trainer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="a learn run's model_sft")
    ap.add_argument("--config", type=Path, default=REPO / "trainer" / "configs" / "learn_cpu_mixed.yaml")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not (args.model / "config.json").is_file():
        ap.error(f"--model {args.model}: no saved model there (a learn run's model_sft)")
    cfg = LearnConfig.from_yaml(args.config, seed=args.seed, threads=args.threads,
                                out_dir=str(REPO / "runs" / "bench_update_packing"))
    suite = prepare(cfg)
    with LocalFarm(FarmConfig(catalog=str(suite.catalog), envs=suite.envs, pool=PoolConfig(warm=16))) as farm:
        trainer = Trainer(cfg.train_config(args.model, suite), farm.url)
        batches = asyncio.run(_batches(trainer, args.batches))
    rows = []
    for step, samples in enumerate(batches):
        times: dict[str, list[float]] = {"packed": [], "unpacked": []}
        results = {}
        for r in range(args.rounds):
            for name in (["packed", "unpacked"] if r % 2 == 0 else ["unpacked", "packed"]):
                seconds, stats, weights = _update(trainer, samples, name == "packed", step)
                times[name].append(seconds)
                results[name] = (stats, weights)
        (sp, wp), (su, wu) = results["packed"], results["unpacked"]
        packed = pack_rows(samples)
        rows.append({
            "batch": step, "samples": len(samples),
            "completion_tokens": sum(len(s.completion_ids) for s in samples),
            "tokens_unpacked": sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples),
            "tokens_packed": sum(len(r.ids) for r in packed), "rows_packed": len(packed),
            "seconds": times, "median_s": {k: statistics.median(v) for k, v in times.items()},
            "speedup": statistics.median(times["unpacked"]) / statistics.median(times["packed"]),
            "loss_diff": abs(sp["loss"] - su["loss"]),
            "weight_diff": max(float((wp[k] - wu[k]).detach().abs().max()) for k in wp)})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "seconds"}), flush=True)
    report = {"machine": machine(), "model": str(args.model), "config": str(args.config),
              "rounds": args.rounds, "batches": rows,
              "speedup_median": statistics.median(r["speedup"] for r in rows)}
    print(json.dumps({"speedup_median": report["speedup_median"]}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
