"""Does training against the farm make an agent better? SFT, then pure GRPO, evaluated before,
between and after on training tasks and on held-out tasks.

    envfarm learn --config trainer/configs/learn_cpu.yaml [--seed 1] [--out-dir DIR]

1. A random-init Qwen3 (the tiny model's locally trained tokenizer, the config's dimensions).
2. Evaluation: the model's own greedy episodes on every train and held-out task, through the
   agent loop against the farm (what ``envfarm rollout --hf-model`` runs).
3. SFT: the reference solutions of the *train* tasks played through the same agent loop
   (tool results, windows and tool listing exactly as at rollout), one sample per assistant
   turn on its windowed prompt, loss on that turn's tokens only. Held-out tasks are never seen.
4. Evaluation again; then GRPO with ``guide_fraction: 0`` (the model's own rollouts only) on
   the train tasks, starting from the SFT model (also the KL reference); evaluation again.

``out_dir`` gets ``learn.json`` (every evaluation, per split, the GRPO curve and the timings),
``learn.png``, the models and the GRPO run's own metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from trainer.config import TrainConfig


class SFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epochs: int = Field(default=8, ge=0)
    lr: float = Field(default=3e-3, gt=0)
    batch: int = Field(default=8, ge=1, description="samples per optimizer step")


class LearnConfig(BaseModel):
    """Every knob of ``envfarm learn`` (see trainer/configs/learn_cpu.yaml)."""

    model_config = ConfigDict(extra="forbid")

    out_dir: str = "runs/learn_cpu"
    seed: int = 0
    threads: int = Field(default=1, ge=1)
    envs: list[str] | None = None
    train_tasks: list[int] = Field(description="task indices trained on (every env)")
    heldout_tasks: list[int] = Field(description="task indices never trained on")
    dims: dict[str, Any] = Field(default_factory=dict, description="Qwen3Config overrides of "
                                 "the tiny model's shape")
    sft: SFTConfig = Field(default_factory=SFTConfig)
    grpo: dict[str, Any] = Field(default_factory=dict, description="TrainConfig settings for "
                                 "the GRPO phase (guide_fraction is forced to 0)")
    eval_max_new_tokens: int = 96
    eval_temperature: float = 0.0

    def train_config(self, model: Path, envs: list[str]) -> TrainConfig:
        settings = {**self.grpo, "model": str(model), "guide_fraction": 0.0, "seed": self.seed,
                    "threads": self.threads, "envs": envs, "tasks": self.train_tasks,
                    "out_dir": str(Path(self.out_dir) / "grpo")}
        return TrainConfig.model_validate(settings)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> LearnConfig:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)


def random_model(out: Path, dims: dict[str, Any], seed: int) -> Path:
    """A random-init Qwen3 with the tiny model's tokenizer and the given shape, saved in HF
    format."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from trainer.tiny_model import TINY_CONFIG, tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    config = Qwen3Config(vocab_size=len(tokenizer), bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **{**TINY_CONFIG, **dims})
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


async def evaluate(farm_url: str, model_path: Path, jobs: list[tuple[str, int]],
                   episode_cfg: Any, max_new_tokens: int, temperature: float,
                   out: Path | None = None) -> dict[str, Any]:
    """The model's own episodes on ``jobs``: success rate, mean reward, format-error rate."""
    from envfarm.client import Farm
    from trainer.hf import HFPolicy
    from trainer.rollout import run_rollouts, scores

    policy = HFPolicy.from_path(model_path, max_new_tokens=max_new_tokens,
                                temperature=temperature)
    async with Farm(farm_url) as farm:
        results = await run_rollouts(farm, policy, jobs, concurrency=4, config=episode_cfg,
                                     out=out)
    s = scores(results)["overall"]
    return {"episodes": s.episodes, "valid": s.valid, "successes": s.successes,
            "success_rate": s.success_rate, "reward_mean": s.reward_mean,
            "format_error_rate": s.format_errors / s.episodes if s.episodes else None}


async def sft_samples(farm_url: str, catalog: Any, jobs: list[tuple[str, int]],
                      episode_cfg: Any, tokenizer: Any) -> list[Any]:
    """The train tasks' reference solutions through the agent loop: one sample per turn."""
    from envfarm.client import Farm
    from trainer.policy import ScriptedPolicy
    from trainer.rollout import run_rollouts
    from trainer.train import turn_sample

    whole = dataclasses.replace(episode_cfg, max_turns=64)  # a reference is never cut short
    async with Farm(farm_url) as farm:
        results = await run_rollouts(farm, ScriptedPolicy.from_catalog(catalog), jobs,
                                     concurrency=8, config=whole)
    failed = [(r.env, r.task_idx, r.reason) for r in results if not r.success]
    if failed:
        raise RuntimeError(f"reference solutions that do not solve their task: {failed}")
    return [turn_sample(tokenizer, rec, 1.0) for r in results for rec in r.turns]


def sft(model: Any, samples: list[Any], pad_id: int, cfg: SFTConfig, seed: int,
        logit_chunk: int = 1024) -> list[float]:
    """Supervised steps on the samples' completion tokens; the mean loss of each epoch."""
    import torch

    from trainer.grpo import completion_logprobs

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(seed)
    order = list(range(len(samples)))
    losses = []
    model.train()
    for _ in range(cfg.epochs):
        rng.shuffle(order)
        total, tokens = 0.0, 0
        for i in range(0, len(order), cfg.batch):
            batch = [samples[j] for j in order[i:i + cfg.batch]]
            n = sum(len(s.completion_ids) for s in batch)
            opt.zero_grad(set_to_none=True)
            for s in batch:  # one at a time: no padding, CPU attention's fast kernel
                logp = completion_logprobs(model, [s], pad_id, logit_chunk)
                (-logp.sum() / n).backward()  # token-mean over the batch
                total += float(-logp.sum().detach())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            tokens += n
        losses.append(total / max(1, tokens))
    return losses


def run(cfg: LearnConfig, farm_url: str, log: Any = print) -> dict[str, Any]:
    import torch

    from envfarm import load_catalog
    from trainer.episode import EpisodeConfig
    from trainer.hf import load_model
    from trainer.train import train

    torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    catalog = load_catalog()
    envs = [catalog[e].name for e in (cfg.envs or catalog.servable)]
    split = {"train": [(e, i) for e in envs for i in cfg.train_tasks],
             "heldout": [(e, i) for e in envs for i in cfg.heldout_tasks]}
    grpo_cfg = cfg.train_config(out / "model_sft", envs)
    episode_cfg = EpisodeConfig(max_turns=grpo_cfg.max_turns, window=grpo_cfg.window,
                                tool_listing=grpo_cfg.tool_listing,
                                max_tool_chars=grpo_cfg.max_tool_chars)
    report: dict[str, Any] = {"seed": cfg.seed, "envs": envs, "split": {
        k: len(v) for k, v in split.items()}, "evals": {}, "seconds": {}}

    def evaluate_all(stage: str, model_path: Path) -> None:
        t = time.perf_counter()
        report["evals"][stage] = {
            name: asyncio.run(evaluate(farm_url, model_path, jobs, episode_cfg,
                                       cfg.eval_max_new_tokens, cfg.eval_temperature,
                                       out / f"eval_{stage}_{name}.jsonl"))
            for name, jobs in split.items()}
        report["seconds"][f"eval_{stage}"] = time.perf_counter() - t
        log(json.dumps({"stage": stage, **{k: v["success_rate"] for k, v in
                                           report["evals"][stage].items()}}))

    init = random_model(out / "model_init", cfg.dims, cfg.seed)
    evaluate_all("init", init)

    t = time.perf_counter()
    model, tokenizer = load_model(init, dtype="float32")
    torch.manual_seed(cfg.seed)
    samples = asyncio.run(sft_samples(farm_url, catalog, split["train"], episode_cfg, tokenizer))
    report["sft_samples"] = len(samples)
    report["sft_tasks"] = [list(job) for job in split["train"]]
    report["sft_loss"] = sft(model, samples, tokenizer.pad_token_id, cfg.sft, cfg.seed)
    model.save_pretrained(out / "model_sft")
    tokenizer.save_pretrained(out / "model_sft")
    report["seconds"]["sft"] = time.perf_counter() - t
    log(json.dumps({"stage": "sft", "samples": len(samples),
                    "loss": [round(x, 3) for x in report["sft_loss"]]}))
    evaluate_all("sft", out / "model_sft")

    t = time.perf_counter()
    records = asyncio.run(train(grpo_cfg, farm_url, log=lambda line: None))
    report["seconds"]["grpo"] = time.perf_counter() - t
    report["grpo_curve"] = [{k: r.get(k) for k in (
        "step", "model_success_rate", "model_reward_mean", "model_format_error_rate",
        "update_clip_frac", "groups_used")} for r in records]
    from trainer import checkpoint

    final = checkpoint.latest(Path(grpo_cfg.out_dir) / "checkpoints")
    evaluate_all("grpo", final)
    report["seconds"]["total"] = time.perf_counter() - started
    (out / "learn.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "learn.png")
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    """Left: evaluations at each stage (the model's own greedy success and format-error rate,
    train and held-out tasks); right: the GRPO curve over its sampled rollouts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    stages = list(report["evals"])
    bars = [("train", "success_rate", "train: success", "tab:blue", None),
            ("heldout", "success_rate", "held-out: success", "tab:orange", None),
            ("train", "format_error_rate", "train: format errors", "tab:blue", "//"),
            ("heldout", "format_error_rate", "held-out: format errors", "tab:orange", "//")]
    for k, (split, key, label, color, hatch) in enumerate(bars):
        ys = [report["evals"][s][split][key] or 0.0 for s in stages]
        left.bar([i + 0.2 * k for i in range(len(stages))], ys, width=0.2, label=label,
                 color=color, alpha=0.5 if hatch else 1.0, hatch=hatch)
    left.set_xticks([i + 0.3 for i in range(len(stages))], stages)
    left.set_ylim(0, 1.05)
    left.set_ylabel("model's own episodes, greedy")
    left.legend(fontsize="small")
    curve = report.get("grpo_curve", [])
    steps = [r["step"] for r in curve]
    for key, label in (("model_success_rate", "success (own rollouts)"),
                       ("model_format_error_rate", "format-error rate")):
        right.plot(steps, [r[key] if r[key] is not None else float("nan") for r in curve],
                   marker="o", label=label)
    right.set_xlabel("GRPO step (guide_fraction 0)")
    right.set_ylim(-0.05, 1.05)
    right.legend()
    fig.suptitle(f"envfarm learn, seed {report['seed']}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
