"""Does training against the farm make an agent better? SFT to partial competence, then pure GRPO
on the farm's rewards, with the model's own success measured on train and held-out tasks.

    envfarm learn --config trainer/configs/learn_cpu.yaml [--seed 1] [--out-dir DIR]

1. The task suite (``trainer.suite``): EnvFactory tasks on the bundled envs, requests from the
   TEMPLATE writer (``synth.factory.template_writer``), split train / held-out by unseen values
   and unseen chains; built once and cached. The farm serves its catalog.
2. A random-init Qwen3; its tokenizer is learned from the catalog and the train tasks only.
3. SFT on the reference episodes of (a share of) the train tasks, one sample per turn on the
   rollout's windowed prompt. After each epoch the model's own *sampled* success on a fixed probe
   of train tasks is measured; SFT stops once it reaches ``sft.stop_at`` (partial competence:
   GRPO groups then hold different rewards), or after ``sft.epochs``.
4. Evaluation: the model's own episodes, greedy and sampled at T = 1, on the held-out tasks (all)
   and the train tasks (all, or a fixed random subset: ``eval.train_tasks``).
5. GRPO with ``guide_fraction: 0`` on the train tasks, from the farm's rewards (code path, or the
   LLM judge with ``grpo.reward_path: llm``); held-out greedy success every ``eval.every`` steps.
6. Evaluation again. ``out_dir`` gets ``learn.json`` (every evaluation, the SFT and GRPO curves,
   CPU and wall seconds, load), ``learn.png`` and the GRPO run's own metrics.

Deterministic under ``seed`` (model init, SFT order, every sampled token: ``trainer.batched``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from trainer.config import TrainConfig
from trainer.induction import CopyWarmup
from trainer.suite import Suite, SuiteConfig


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dims: dict[str, Any] = Field(default_factory=dict, description="Qwen3Config overrides of the "
                                 "tiny model's shape (trainer/tiny_model.py)")
    vocab_size: int = Field(default=2048, ge=300)
    split_digits: bool = Field(default=True, description="every digit one token")
    identifiers: bool = Field(default=True, description="a snake_case name is one word to BPE "
                              "(a tool name one token)")


class EpisodeSettings(BaseModel):
    """The agent loop, the same in SFT, evaluation and GRPO."""

    model_config = ConfigDict(extra="forbid")

    system: str = Field(default="brief", pattern="^(full|brief)$")
    tool_listing: str = Field(default="names", pattern="^(full|compact|names)$")
    window: int = 3
    max_turns: int = Field(default=8, ge=2)
    max_tool_chars: int = Field(default=120, ge=100)
    max_new_tokens: int = Field(default=96, ge=1)
    brief_reasoning: bool = Field(default=True, description="reference turns reason in two words")
    restate_step: bool = Field(default=False, description="a reference call's reasoning repeats the "
                               "request's 'Step k: ...' sentence (the call then copies nearby text)")
    object_arguments: bool = Field(default=False, description="reference calls give call_tool's "
                                   "arguments as a JSON object, as the request writes them")

    def reference_style(self) -> dict[str, bool]:
        """How the reference turns are written (``trainer.policy.ScriptedPolicy``'s options)."""
        return {"brief": self.brief_reasoning, "restate": self.restate_step,
                "object_arguments": self.object_arguments}


class SFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epochs: int = Field(default=8, ge=0, description="at most")
    lr: float = Field(default=2e-3, gt=0)
    cosine: bool = Field(default=False, description="decay the rate to 0 over `epochs` (else constant)")
    batch: int = Field(default=32, ge=1, description="samples per optimizer step")
    micro_batch: int = Field(default=16, ge=1, description="rows per forward pass")
    share: float = Field(default=1.0, gt=0, le=1, description="share of the train tasks SFT sees")
    stop_at: float | None = Field(default=None, ge=0, le=1, description="stop once the sampled "
                                  "success on the probe tasks reaches this")
    probe_tasks: int = Field(default=64, ge=1, description="train tasks of that probe")


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train_tasks: int | None = Field(default=None, ge=1, description="a fixed random subset of the "
                                    "train tasks (None: all); held-out tasks are always all")
    sampled: bool = Field(default=True, description="also evaluate sampled at T = 1")
    every: int = Field(default=0, ge=0, description="held-out greedy evaluation every N GRPO steps")


class LearnConfig(BaseModel):
    """Every knob of ``envfarm learn`` (see trainer/configs/learn_cpu.yaml)."""

    model_config = ConfigDict(extra="forbid")

    out_dir: str = "runs/learn"
    seed: int = 0
    threads: int = Field(default=2, ge=1)
    start_from: str | None = Field(default=None, description="a saved SFT model (a learn run's "
                                   "model_sft folder): skip the warm-up and SFT, GRPO from it")
    resume: bool = Field(default=False, description="continue this out_dir's GRPO from its last "
                         "checkpoint (optimizer and step restored) up to grpo.steps; the evaluations "
                         "before GRPO and the earlier steps' curve come from its learn.json")
    suite: SuiteConfig = Field(default_factory=SuiteConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    episode: EpisodeSettings = Field(default_factory=EpisodeSettings)
    warmup: CopyWarmup = Field(default_factory=CopyWarmup, description="copy rows before SFT "
                               "(trainer/induction.py)")
    sft: SFTConfig = Field(default_factory=SFTConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    grpo: dict[str, Any] = Field(default_factory=dict, description="TrainConfig settings of the "
                                 "GRPO phase (guide_fraction is forced to 0)")

    def train_config(self, model: Path, suite: Suite) -> TrainConfig:
        e = self.episode
        settings = {"max_new_tokens": e.max_new_tokens, "batched": True, "concurrency": 4096,
                    **self.grpo, "model": str(model), "guide_fraction": 0.0, "seed": self.seed,
                    "threads": self.threads, "catalog": str(suite.catalog), "jobs": suite.jobs("train"),
                    "window": e.window, "max_turns": e.max_turns, "max_tool_chars": e.max_tool_chars,
                    "tool_listing": e.tool_listing, "system": e.system,
                    "out_dir": str(Path(self.out_dir) / "grpo")}
        return TrainConfig.model_validate(settings)

    def episode_config(self) -> Any:
        from trainer.episode import EpisodeConfig
        from trainer.format import system_text

        e = self.episode
        return EpisodeConfig(max_turns=e.max_turns, window=e.window, tool_listing=e.tool_listing,
                             max_tool_chars=e.max_tool_chars, system=system_text(e.system))

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> LearnConfig:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)


def prepare(cfg: LearnConfig, log: Any = print) -> Suite:
    """The task suite (built on first use, then cached): its catalog is what the farm serves."""
    from trainer.suite import build_suite

    return build_suite(cfg.suite, log=log)


class _Clock:
    """Wall and CPU seconds (this process and its children) per stage, and the load."""

    def __init__(self) -> None:
        self.start, self.cpu0 = time.perf_counter(), _cpu()
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.load = {"start": os.getloadavg()}

    def stage(self, name: str, wall0: float, cpu0: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - wall0
        self.cpu[name] = self.cpu.get(name, 0.0) + _cpu() - cpu0

    def report(self) -> dict[str, Any]:
        self.load["end"] = os.getloadavg()
        return {"seconds": {**self.seconds, "total": time.perf_counter() - self.start},
                "cpu_seconds": {**self.cpu, "total": _cpu() - self.cpu0}, "load": self.load,
                "machine": machine()}


def machine() -> dict[str, Any]:
    """What the seconds were measured on: the same run takes ~2x as long on one 2-core VM as on
    another (benchmarks/passes/2026-11-27-learning.md, ninth pass), so a timing names its CPU."""
    import platform

    import torch

    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux
        info = ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": cores,
            "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads()}


def _cpu() -> float:
    """CPU seconds of this process and every child it has (the farm's env workers)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def run(cfg: LearnConfig, farm_url: str, suite: Suite, log: Any = print) -> dict[str, Any]:
    import torch

    from envfarm import load_catalog
    from trainer.hf import load_model
    from trainer.learn_steps import new_model, tokenizer_texts

    torch.set_num_threads(cfg.threads)
    clock = _Clock()
    out = Path(cfg.out_dir)
    before = _resumable(out) if cfg.resume else None
    if before is None:
        shutil.rmtree(out / "grpo", ignore_errors=True)  # a fresh run: nothing to resume
    out.mkdir(parents=True, exist_ok=True)
    catalog = load_catalog(suite.catalog)
    train = suite.jobs("train")
    evals = _eval_jobs(cfg, suite)
    report: dict[str, Any] = {"seed": cfg.seed, "writer": suite.manifest["writer"], "suite": {
        "key": suite.manifest["key"], "counts": suite.manifest["counts"]},
        "evals": {}, "config": cfg.model_dump()}
    sft_model = Path(cfg.start_from) if cfg.start_from else out / "model_sft"
    if cfg.start_from is None and before is None:
        texts = tokenizer_texts(catalog, train, cfg.episode.reference_style())
        init = new_model(out / "model_init", texts, cfg.model, cfg.seed)
        model, tokenizer = load_model(init, dtype="float32")
    else:  # GRPO from a saved SFT model (a resumed run: its own, or the one it started from)
        model, tokenizer = load_model(sft_model, dtype="float32")
    report["parameters"] = sum(p.numel() for p in model.parameters())
    ctx = _Run(cfg, farm_url, catalog, model, tokenizer, evals, clock, report, log)
    if before is not None:  # what ran before the last checkpoint is already measured
        report["evals"] = {k: v for k, v in before["evals"].items() if k != "grpo"}
        report.update({k: before[k] for k in ("warmup", "sft") if k in before})
        report["resumed"] = {"seconds": before["seconds"], "cpu_seconds": before["cpu_seconds"],
                             "load": before["load"], "curve": before.get("grpo_curve", [])}
    elif cfg.start_from is None:
        ctx.evaluate("init", sampled=False)
        ctx.warm_up(texts)
        ctx.supervised(train)
        model.save_pretrained(out / "model_sft")
        tokenizer.save_pretrained(out / "model_sft")
    if before is None:
        ctx.evaluate("sft")
    ctx.grpo(sft_model, suite)
    ctx.evaluate("grpo")
    report.update(clock.report())
    (out / "learn.json").write_text(json.dumps(report, indent=1))
    from trainer.learn_plot import plot

    plot(report, out / "learn.png")
    return report


def _resumable(out: Path) -> dict[str, Any]:
    """The learn.json of the run being resumed, checked to have a GRPO checkpoint to go on from."""
    from trainer import checkpoint

    report = out / "learn.json"
    if not report.is_file() or checkpoint.latest(out / "grpo" / "checkpoints") is None:
        raise ValueError(f"--resume: {out} holds no finished learn run with a GRPO checkpoint "
                         "(learn.json and grpo/checkpoints/latest)")
    return json.loads(report.read_text())


def _eval_jobs(cfg: LearnConfig, suite: Suite) -> list[tuple[str, int, str]]:
    """(env, task_idx, split) evaluated at every stage: every held-out task, and the train tasks
    (a fixed subset, the same for every seed, when ``eval.train_tasks`` is set)."""
    train = suite.jobs("train")
    if cfg.eval.train_tasks is not None and cfg.eval.train_tasks < len(train):
        train = sorted(random.Random("eval-train").sample(train, cfg.eval.train_tasks))
    held = [(env, idx, suite.split_of(env, idx)) for env, idx in suite.jobs("heldout")]
    return [(env, idx, "train") for env, idx in train] + held


class _Run:
    """One run's state: the model, the farm, what has been measured."""

    def __init__(self, cfg: LearnConfig, farm_url: str, catalog: Any, model: Any, tokenizer: Any,
                 evals: list[tuple[str, int, str]], clock: _Clock, report: dict[str, Any], log: Any) -> None:
        self.cfg, self.farm_url, self.catalog = cfg, farm_url, catalog
        self.model, self.tokenizer, self.evals = model, tokenizer, evals
        self.clock, self.report, self.log = clock, report, log
        self.episode_cfg = cfg.episode_config()

    async def _episodes_async(self, jobs: list[tuple[str, int, str]], temperature: float, tag: str,
                              file: str | None = None) -> dict[str, Any]:
        from trainer.learn_steps import evaluate

        out = Path(self.cfg.out_dir) / file if file else None
        return await evaluate(
            self.farm_url, self.model, self.tokenizer, [(e, i) for e, i, _ in jobs], [s for *_, s in jobs],
            self.episode_cfg, temperature=temperature, max_new_tokens=self.cfg.episode.max_new_tokens,
            seed=self.cfg.seed, tag=tag, out=out)

    def _episodes(self, jobs: list[tuple[str, int, str]], temperature: float, tag: str,
                  file: str | None = None) -> dict[str, Any]:
        return asyncio.run(self._episodes_async(jobs, temperature, tag, file))

    def evaluate(self, stage: str, sampled: bool | None = None) -> None:
        wall0, cpu0 = time.perf_counter(), _cpu()
        result = {"greedy": self._episodes(self.evals, 0.0, f"{stage}:greedy", f"eval_{stage}_greedy.jsonl")}
        if self.cfg.eval.sampled if sampled is None else sampled:
            result["sampled"] = self._episodes(self.evals, 1.0, f"{stage}:sampled",
                                               f"eval_{stage}_sampled.jsonl")
        self.report["evals"][stage] = result
        self.clock.stage(f"eval_{stage}", wall0, cpu0)
        self.log(json.dumps({"stage": stage, **{f"{mode}_{split}": round(v["success_rate"] or 0.0, 3)
                                                for mode, r in result.items() for split, v in r.items()}}))

    def warm_up(self, texts: list[str]) -> None:
        from trainer.induction import chance, copy_warmup, token_pool

        if self.cfg.warmup.steps == 0:
            return
        wall0, cpu0 = time.perf_counter(), _cpu()
        pool = token_pool(self.tokenizer, texts)
        curve = copy_warmup(self.model, pool, self.cfg.warmup, self.cfg.seed)
        self.report["warmup"] = {"pool": len(pool), "chance": chance(pool), "loss_per_100": curve}
        self.clock.stage("warmup", wall0, cpu0)
        self.log(json.dumps({"warmup_steps": self.cfg.warmup.steps, "chance": round(chance(pool), 3),
                             "loss_first": round(curve[0], 3), "loss_last": round(curve[-1], 3)}))

    def supervised(self, train: list[tuple[str, int]]) -> None:
        from trainer.learn_steps import reference_samples, sft

        wall0, cpu0 = time.perf_counter(), _cpu()
        s = self.cfg.sft
        jobs = train if s.share >= 1 else sorted(random.Random("sft-share").sample(
            train, max(1, round(s.share * len(train)))))
        samples = asyncio.run(reference_samples(self.farm_url, self.catalog, jobs, self.episode_cfg,
                                                self.tokenizer, self.cfg.episode.reference_style()))
        probe = sorted(random.Random("sft-probe").sample(jobs, min(s.probe_tasks, len(jobs))))
        curve: list[dict[str, Any]] = []

        def after_epoch(epoch: int, loss: float) -> bool:
            if s.stop_at is None:
                self.log(json.dumps({"sft_epoch": epoch, "loss": round(loss, 4)}))
                return False
            got = self._episodes([(e, i, "train") for e, i in probe], 1.0, f"sft-probe:{epoch}")["all"]
            curve.append({"epoch": epoch, "loss": loss, "probe_sampled_success": got["success_rate"],
                          "probe_format_error_rate": got["format_error_rate"]})
            self.log(json.dumps(curve[-1]))
            return (got["success_rate"] or 0.0) >= s.stop_at

        losses = sft(self.model, samples, self.tokenizer.pad_token_id, epochs=s.epochs, lr=s.lr,
                     batch=s.batch, micro_batch=s.micro_batch, seed=self.cfg.seed, cosine=s.cosine,
                     after_epoch=after_epoch)
        self.report["sft"] = {"tasks": len(jobs), "samples": sum(map(len, samples)), "loss": losses,
                              "epochs": len(losses), "probe": curve, "probe_tasks": len(probe)}
        self.clock.stage("sft", wall0, cpu0)

    def grpo(self, start: Path, suite: Suite) -> None:
        wall0, cpu0 = time.perf_counter(), _cpu()
        self.report["grpo_curve"] = asyncio.run(self._grpo(start, suite))
        self.clock.stage("grpo", wall0, cpu0)

    async def _grpo(self, start: Path, suite: Suite) -> list[dict[str, Any]]:
        """GRPO steps, in one event loop (the judge's clients live in it)."""
        from trainer.train import Trainer, headline

        trainer = Trainer(self.cfg.train_config(start, suite), self.farm_url)
        self.model = trainer.model  # the SFT model (or a resumed checkpoint), now trained by GRPO
        earlier = self.report.get("resumed", {}).get("curve", [])
        curve, every = [r for r in earlier if r["step"] < trainer.step], self.cfg.eval.every
        held = [job for job in self.evals if job[2] != "train"]
        try:
            while not trainer.done:
                record = await trainer.train_step()
                row = {k: record.get(k) for k in (
                    "step", "model_success_rate", "model_reward_mean", "model_format_error_rate",
                    "groups", "groups_used", "update_clip_frac", "update_kl", "update_samples", "ends",
                    "rollout_s", "update_s", "by_temperature")}
                row["signal_share"] = record["groups_used"] / record["groups"] if record["groups"] else 0.0
                if every and (record["step"] + 1) % every == 0:
                    got = (await self._episodes_async(held, 0.0, f"grpo-heldout:{record['step']}"))["all"]
                    row["heldout_greedy_success"] = got["success_rate"]
                    row["heldout_greedy_format_error_rate"] = got["format_error_rate"]
                curve.append(row)
                self.log(json.dumps({**headline(record), "signal_share": round(row["signal_share"], 3),
                                     **{k: row[k] for k in ("heldout_greedy_success",) if k in row}}))
        finally:
            if trainer.judge is not None:
                await trainer.judge.aclose()
        return curve
