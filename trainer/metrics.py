"""Per-step metrics: computed from the step's episodes, appended as JSONL, plotted as PNG."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from judge import Outcome
from trainer.episode import EpisodeResult


def episode_metrics(episodes: Sequence[EpisodeResult], rollout_s: float) -> dict[str, Any]:
    """Reward, success, invalid and format-error rates, turns, tokens, env calls/s.

    The model's own episodes and the guided ones (reference solutions replayed in a group) are
    measured apart: ``model_*`` is what the model can do, ``guided_*`` what the guides did;
    the unprefixed ``reward_mean``/``reward_std`` are over every valid episode of the step (what
    GRPO normalised), ``success_rate`` is the model's own."""
    n = len(episodes)
    valid = [e for e in episodes if e.valid]
    rewards = [e.reward for e in valid if e.reward is not None]
    tokens = sum(len(t.generation.completion_ids or ()) for e in episodes for t in e.turns)
    env_calls = sum(e.env_calls for e in episodes)
    model = [e for e in episodes if not _guided(e)]
    guided = [e for e in episodes if _guided(e)]
    own = _rates(model, "model")
    return {
        "episodes": n,
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        **own,
        **_rates(guided, "guided"),
        "success_rate": own["model_success_rate"],
        "invalid_rate": (n - len(valid)) / n if n else 0.0,
        "tokens": tokens,
        "model_episodes": len(model),
        "guided_episodes": len(guided),
        "ends": dict(Counter(e.end.value for e in episodes)),
        "env_calls": env_calls,
        "env_calls_per_s": env_calls / rollout_s if rollout_s > 0 else 0.0,
        "farm_wait_share": (sum(e.env_seconds for e in episodes) /
                            sum(e.seconds for e in episodes)) if n and any(
                                e.seconds for e in episodes) else 0.0,
        "rollout_s": rollout_s,
    }


def _rates(episodes: Sequence[EpisodeResult], prefix: str) -> dict[str, Any]:
    """Reward, success, format-error rate and turns of one kind of episode (None: none ran)."""
    n = len(episodes)
    valid = [e for e in episodes if e.valid and e.reward is not None]
    return {
        f"{prefix}_reward_mean": statistics.fmean(e.reward for e in valid) if valid else None,
        f"{prefix}_success_rate": sum(e.success for e in valid) / len(valid) if valid else None,
        f"{prefix}_format_error_rate": (sum(e.outcome == Outcome.format_error.value
                                            for e in episodes) / n) if n else None,
        f"{prefix}_turns_mean": statistics.fmean(len(e.turns) for e in episodes) if n else None,
    }


def by_temperature(episodes: Sequence[EpisodeResult]) -> dict[str, dict[str, Any]]:
    """The model's own rates per sampling temperature (a group mixing temperatures); {} when
    every episode sampled at one."""
    groups: dict[float, list[EpisodeResult]] = {}
    for e in episodes:
        if e.turns and not _guided(e) and e.turns[0].generation.temperature is not None:
            groups.setdefault(e.turns[0].generation.temperature, []).append(e)
    if len(groups) < 2:
        return {}
    return {f"T{t:g}": _rates(eps, "model") for t, eps in sorted(groups.items())}


def _guided(e: EpisodeResult) -> bool:
    return bool(e.turns) and e.turns[0].generation.policy == "scripted"


def append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill: the step is redone after resume
    return out


def keep_until(path: Path, last_step: int) -> None:
    """On resume: forget steps after the checkpoint (they will be run again)."""
    kept = [r for r in read(path) if r.get("step", -1) <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    tmp.replace(path)


def plot(records: Sequence[dict[str, Any]], out: Path) -> None:
    """Reward and success rate over steps, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [r["step"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label, style in (
            ("model_reward_mean", "model's own: reward", "-"),
            ("model_success_rate", "model's own: success rate", "-"),
            ("model_format_error_rate", "model's own: format-error rate", "-"),
            ("guided_success_rate", "guided (reference replays): success rate", ":"),
            ("reward_mean", "all valid episodes: reward", "--")):
        ys = [r.get(key) for r in records]
        if any(y is not None for y in ys):
            ax.plot(steps, [float("nan") if y is None else y for y in ys], marker="o",
                    linestyle=style, label=label)
    ax.set_xlabel("GRPO step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-1.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title("envfarm train")
    fig.tight_layout()
    tmp = out.with_name(out.stem + ".tmp.png")
    fig.savefig(tmp, dpi=80)
    plt.close(fig)
    tmp.replace(out)
