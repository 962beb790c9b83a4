"""Sum up ``envfarm learn`` runs over seeds: the held-out and train gains of GRPO over SFT, their
mean and standard deviation, whether issue 31's target is met, CPU and wall time; one figure.

    python benchmarks/trainer/learn_summary.py runs/learn_s0 runs/learn_s1 runs/learn_s2 \\
        --name learn_cpu --plot docs/img/learning-cpu.png

A run given as ``SFT_RUN+GRPO_RUN`` is one seed whose GRPO was run again from its SFT model
(``envfarm learn --start-from SFT_RUN/model_sft``): its stages up to SFT come from the first,
GRPO and the last evaluation from the second (whose GRPO may have been resumed with
``--resume``: its GRPO time then counts the steps before the resume too).

Writes ``benchmarks/results/learning/<name>_seed<N>.json`` (each run folder's learn.json) and
``benchmarks/results/learning/<name>_summary.json``. The target: held-out success, greedy AND sampled at
T = 1, after GRPO exceeds after SFT by >= 10 points on the mean over the seeds and by more than
twice the seeds' standard deviation of that gain; train success rises too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def heldout(report: dict[str, Any], stage: str, mode: str) -> float:
    got = report["evals"][stage][mode]
    parts = [got[s] for s in ("heldout_values", "heldout_chains") if s in got]
    return sum(p["successes"] for p in parts) / sum(p["valid"] for p in parts)


def train(report: dict[str, Any], stage: str, mode: str) -> float:
    return report["evals"][stage][mode]["train"]["success_rate"] or 0.0


def split_rate(report: dict[str, Any], stage: str, mode: str, split: str) -> float | None:
    return report["evals"][stage][mode].get(split, {}).get("success_rate")


def gains(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (split, mode): each seed's after-SFT and after-GRPO success, the gain's mean and std."""
    out: dict[str, Any] = {}
    for name, fn in (("heldout", heldout), ("train", train)):
        for mode in ("greedy", "sampled"):
            sft = [fn(r, "sft", mode) for r in reports]
            grpo = [fn(r, "grpo", mode) for r in reports]
            delta = [b - a for a, b in zip(sft, grpo, strict=True)]
            std = statistics.stdev(delta) if len(delta) > 1 else 0.0
            out[f"{name}_{mode}"] = {"after_sft": sft, "after_grpo": grpo, "gain": delta,
                                     "gain_mean": statistics.fmean(delta), "gain_std": std,
                                     "met": statistics.fmean(delta) >= 0.10 and statistics.fmean(delta) > 2 * std}
    for split in ("heldout_values", "heldout_chains"):
        for mode in ("greedy", "sampled"):
            out[f"{split}_{mode}"] = {stage: [split_rate(r, stage, mode, split) for r in reports]
                                      for stage in ("sft", "grpo")}
    return out


def by_temperature(report: dict[str, Any], span: int = 20) -> dict[str, Any]:
    """A mixed-temperature run's train rollouts per temperature: mean success and format-error
    rate over its first and last ``span`` GRPO steps; {} for a one-temperature run."""
    curve = [r for r in report.get("grpo_curve", []) if r.get("by_temperature")]
    if not curve:
        return {}
    out: dict[str, Any] = {}
    for name, rows in (("first", curve[:span]), ("last", curve[-span:])):
        for t in rows[0]["by_temperature"]:
            for key in ("model_success_rate", "model_format_error_rate"):
                vals = [r["by_temperature"][t][key] for r in rows if r["by_temperature"].get(t, {}).get(key) is not None]
                out[f"{t}_{key.removeprefix('model_')}_{name}{span}"] = statistics.fmean(vals) if vals else None
    return out


def _saved(arg: str) -> bool:
    return arg.endswith(".json") and Path(arg).is_file()


def load(arg: str) -> dict[str, Any]:
    """A run's learn.json, ``SFT_RUN+GRPO_RUN`` merged (see the module doc), or a report this
    script wrote before (``benchmarks/results/learning/<name>_seed<N>.json``: a seed whose run
    folder is gone)."""
    if _saved(arg):
        return json.loads(Path(arg).read_text())
    first, _, second = arg.partition("+")
    report = json.loads((Path(first) / "learn.json").read_text())
    if not second:
        return report
    grpo = json.loads((Path(second) / "learn.json").read_text())
    if grpo.get("config", {}).get("start_from") is None or grpo["seed"] != report["seed"]:
        raise SystemExit(f"{second}: not a --start-from run of seed {report['seed']}")
    merged = {**report, "evals": {**report["evals"], "grpo": grpo["evals"]["grpo"]},
              "grpo_curve": grpo["grpo_curve"], "grpo_run": second,
              "config": {**report["config"], "grpo": grpo["config"]["grpo"]}}
    resumed = grpo.get("resumed")  # a --resume run: its GRPO time adds to the steps before it
    for key in ("seconds", "cpu_seconds"):
        stages = {k: v for k, v in report[key].items() if k not in ("grpo", "eval_grpo", "total")}
        stages.update({k: grpo[key][k] for k in ("grpo", "eval_grpo")})
        stages["grpo"] += resumed[key]["grpo"] if resumed else 0.0
        merged[key] = {**stages, "total": sum(stages.values())}
    return merged


def main() -> None:
    from trainer.learn_plot import plot_seeds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="out_dir of each seed's run (holding learn.json), "
                    "SFT_RUN+GRPO_RUN, or a <name>_seed<N>.json this script wrote")
    ap.add_argument("--name", default="learn_cpu")
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    reports = [load(run) for run in args.runs]
    results = REPO / "benchmarks" / "results" / "learning"
    results.mkdir(parents=True, exist_ok=True)
    for arg, report in zip(args.runs, reports):
        if not _saved(arg):  # a saved report stays where it is: no second copy
            (results / f"{args.name}_seed{report['seed']}.json").write_text(json.dumps(report, indent=1) + "\n")
    g = gains(reports)
    summary = {
        "runs": [str(r) for r in args.runs], "seeds": [r["seed"] for r in reports],
        "writer": reports[0]["writer"], "suite": reports[0]["suite"], "parameters": reports[0]["parameters"],
        "gains": g, "target_met": g["heldout_greedy"]["met"] and g["heldout_sampled"]["met"]
        and g["train_greedy"]["gain_mean"] > 0 and g["train_sampled"]["gain_mean"] > 0,
        "per_seed": [{"seed": r["seed"], "cpu_seconds": r["cpu_seconds"], "seconds": r["seconds"], "load": r["load"],
                      "machine": r.get("machine"),
                      "sft_epochs": r["sft"]["epochs"], "sft_probe": r["sft"]["probe"],
                      "judge": r.get("judge"), "rollouts_by_temperature": by_temperature(r)}
                     for r in reports]}
    (results / f"{args.name}_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if args.plot:
        plot_seeds(reports, args.plot, f"envfarm learn ({args.name}), seeds {summary['seeds']}; "
                   f"requests: {summary['writer']}")
    print(json.dumps({k: {kk: v[kk] for kk in ("gain_mean", "gain_std", "met")} for k, v in g.items()
                      if "gain_mean" in v}, indent=1))
    print("target met:", summary["target_met"])


if __name__ == "__main__":
    main()
