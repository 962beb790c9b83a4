"""Figures of ``envfarm learn``: one run (``plot``) and several seeds side by side (``plot_seeds``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPLITS = (("train", "train", "tab:blue"), ("heldout_values", "held-out: new values", "tab:orange"),
          ("heldout_chains", "held-out: new chains", "tab:green"))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _stage_value(report: dict[str, Any], stage: str, mode: str, split: str, key: str) -> float:
    got = report["evals"].get(stage, {}).get(mode, {}).get(split, {}).get(key)
    return float("nan") if got is None else got


def plot(report: dict[str, Any], path: Path) -> None:
    """Left: success per stage (greedy solid, sampled dashed) per split; middle: format errors;
    right: the GRPO curve (sampled train success, share of groups with signal, held-out greedy)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    stages = list(report["evals"])
    for ax, key, title in ((axes[0], "success_rate", "success"), (axes[1], "format_error_rate", "format errors")):
        for split, label, color in SPLITS:
            for mode, style in (("greedy", "-"), ("sampled", "--")):
                ys = [_stage_value(report, s, mode, split, key) for s in stages]
                ax.plot(stages, ys, style, color=color, marker="o", label=f"{label} ({mode})")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(f"the model's own {title} per stage")
    axes[0].legend(fontsize="x-small")
    curve = report.get("grpo_curve", [])
    steps = [r["step"] for r in curve]
    right = axes[2]
    right.plot(steps, [_num(r["model_success_rate"]) for r in curve], label="train success (sampled rollouts)")
    right.plot(steps, [_num(r["model_format_error_rate"]) for r in curve], label="train format errors (rollouts)")
    right.plot(steps, [r["signal_share"] for r in curve], ":", label="groups with 2 different rewards")
    held = [(r["step"], r["heldout_greedy_success"]) for r in curve if "heldout_greedy_success" in r]
    if held:
        right.plot(*zip(*held), marker="o", label="held-out success (greedy)")
    right.set_ylim(-0.03, 1.03)
    right.set_xlabel("GRPO step")
    right.legend(fontsize="x-small")
    fig.suptitle(f"envfarm learn, seed {report['seed']}; requests: {report.get('writer', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)


def plot_seeds(reports: list[dict[str, Any]], path: Path, title: str) -> None:
    """Every seed's GRPO curve (train success and format errors of the sampled rollouts, held-out
    greedy success) and its per-stage success, greedy and sampled, train and held-out."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, report in enumerate(reports):
        c = colors[n % len(colors)]
        curve = report.get("grpo_curve", [])
        steps = [r["step"] for r in curve]
        grpo = report.get("config", {}).get("grpo", {})
        t = "/".join(f"{x:g}" for x in grpo.get("group_temperatures") or [grpo.get("temperature", 1.0)])
        axes[0].plot(steps, [_num(r["model_success_rate"]) for r in curve], color=c,
                     label=f"seed {report['seed']}: train success (rollouts, T={t})")
        held = [(r["step"], r["heldout_greedy_success"]) for r in curve if "heldout_greedy_success" in r]
        if held:
            axes[0].plot(*zip(*held), "o--", color=c, label=f"seed {report['seed']}: held-out (greedy)")
        axes[1].plot(steps, [_num(r["model_format_error_rate"]) for r in curve], color=c,
                     label=f"seed {report['seed']}: train format errors (rollouts)")
        held_fmt = [(r["step"], r["heldout_greedy_format_error_rate"]) for r in curve
                    if "heldout_greedy_format_error_rate" in r]
        if held_fmt:
            axes[1].plot(*zip(*held_fmt), "o--", color=c, label=f"seed {report['seed']}: held-out (greedy)")
        stages = list(report["evals"])
        for split, style in (("train", "-"), ("heldout", "--")):
            for mode, marker in (("greedy", "o"), ("sampled", "s")):
                key = "all" if split == "heldout" else "train"
                ys = [_heldout(report, s, mode) if split == "heldout" else _stage_value(report, s, mode, key,
                                                                                         "success_rate")
                      for s in stages]
                axes[2].plot(stages, ys, style, marker=marker, color=c,
                             label=f"seed {report['seed']} {split} {mode}" if n == 0 else None)
    for ax, t in zip(axes, ("success per GRPO step", "format errors per GRPO step",
                            "success per stage (solid train, dashed held-out)"), strict=True):
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(t)
        ax.legend(fontsize="xx-small")
    axes[0].set_xlabel("GRPO step")
    axes[1].set_xlabel("GRPO step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _heldout(report: dict[str, Any], stage: str, mode: str) -> float:
    """Held-out success over both held-out splits (episode-weighted)."""
    got = report["evals"].get(stage, {}).get(mode, {})
    parts = [got.get(s) for s in ("heldout_values", "heldout_chains") if got.get(s)]
    valid = sum(p["valid"] for p in parts)
    return sum(p["successes"] for p in parts) / valid if valid else float("nan")
