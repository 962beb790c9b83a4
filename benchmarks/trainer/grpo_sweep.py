"""GRPO settings side by side from one SFT model: which settings raise the model's own success?

    python benchmarks/trainer/grpo_sweep.py --config trainer/configs/learn_cpu.yaml \\
        --start-from runs/learn_s0/model_sft --out runs/sweep --threads 2 \\
        --variant lr=1e-4 --variant lr=2e-4,kl_coef=0.01 --variant lr=2e-4,batch_size=16

Each ``--variant`` (``grpo`` settings over the config's, comma-separated ``key=value``) runs in
its own process with its own embedded ``--no-ray`` farm, all at once (``--threads`` torch
threads each: give them the cores). Every variant starts from the same SFT model
(``start_from``: no warm-up, no SFT) and is evaluated on the same tasks before and after GRPO.
Writes ``<out>/sweep.json`` (per variant: its settings, the evaluations, the GRPO curve, CPU and
wall seconds) and prints the held-out and train gains.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def parse_variant(text: str) -> dict[str, Any]:
    """``lr=1e-4,kl_coef=0.01`` -> {"lr": 1e-4, "kl_coef": 0.01} (values read as YAML)."""
    import yaml

    out = {}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: expected key=value[,key=value...]")
        out[key.strip()] = yaml.safe_load(value)
    return out


def run_one(config: Path, out: Path, start_from: str, threads: int, grpo: dict[str, Any]) -> None:
    """One variant in this process (the sweep's children run this)."""
    from cluster.compose import LocalFarm
    from envfarm.farm import FarmConfig, PoolConfig
    from trainer.learn import LearnConfig, prepare, run

    base = LearnConfig.from_yaml(config)
    cfg = LearnConfig.from_yaml(config, out_dir=str(out), threads=threads, start_from=start_from,
                                grpo={**base.grpo, **grpo}, eval={**base.eval.model_dump(), "every": 0})
    suite = prepare(cfg, log=lambda line: None)
    farm_cfg = FarmConfig(catalog=str(suite.catalog), envs=suite.envs, pool=PoolConfig(warm=16))
    with LocalFarm(farm_cfg) as farm:
        run(cfg, farm.url, suite, log=print)


def rate(report: dict[str, Any], stage: str, mode: str, held: bool) -> float:
    from benchmarks.trainer.learn_summary import heldout, train

    return (heldout if held else train)(report, stage, mode)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--start-from", required=True, help="the SFT model folder")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], help="grpo settings, key=value,...")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: run this variant's JSON
    args = ap.parse_args()
    if args.one is not None:
        run_one(args.config, args.out, args.start_from, args.threads, json.loads(args.one))
        return
    variants = [parse_variant(v) for v in args.variant] or [{}]
    args.out.mkdir(parents=True, exist_ok=True)
    started, procs = time.time(), []
    for i, grpo in enumerate(variants):
        out = args.out / f"v{i}"
        log = (args.out / f"v{i}.log").open("w")
        procs.append((grpo, out, subprocess.Popen(
            [sys.executable, __file__, "--config", str(args.config), "--start-from", args.start_from,
             "--out", str(out), "--threads", str(args.threads), "--one", json.dumps(grpo)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO)))
    rows = []
    for grpo, out, proc in procs:
        code = proc.wait()
        report_path = out / "learn.json"
        if code != 0 or not report_path.exists():
            rows.append({"grpo": grpo, "error": f"exit {code}; see {out}.log"})
            continue
        r = json.loads(report_path.read_text())
        row = {"grpo": grpo, "seconds": r["seconds"], "cpu_seconds": r["cpu_seconds"],
               "evals": r["evals"], "grpo_curve": r["grpo_curve"]}
        for mode in ("greedy", "sampled"):
            for held in (True, False):
                name = f"{'heldout' if held else 'train'}_{mode}"
                row[name] = [rate(r, "sft", mode, held), rate(r, "grpo", mode, held)]
        curve = r["grpo_curve"]
        row["signal_share"] = sum(c["signal_share"] for c in curve) / len(curve)
        rows.append(row)
    summary = {"config": str(args.config), "start_from": args.start_from, "threads": args.threads,
               "wall_s": time.time() - started, "variants": rows}
    (args.out / "sweep.json").write_text(json.dumps(summary, indent=1))
    for row in rows:
        if "error" in row:
            print(json.dumps(row["grpo"]), row["error"])
            continue
        print(json.dumps(row["grpo"]), " ".join(
            f"{k} {100 * row[k][0]:.1f}->{100 * row[k][1]:.1f}" for k in
            ("heldout_greedy", "heldout_sampled", "train_greedy", "train_sampled")),
            f"signal {row['signal_share']:.2f}")


if __name__ == "__main__":
    main()
