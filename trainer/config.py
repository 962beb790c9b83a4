"""What a training run is: one typed config, read from ``train.yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrainConfig(BaseModel):
    """Every knob of ``envfarm train`` (see trainer/configs/tiny_cpu.yaml)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    # the model
    model: str | None = Field(default=None, description="HF folder (e.g. a Qwen3-4B download); "
                              "None: the tiny random-init test model")
    device: str = Field(default="cpu", description="torch device: cpu, cuda, cuda:1 ...")
    seed: int = 0
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads; 1 is "
                                "fastest on a busy machine (no spinning threads)")
    # where and what
    out_dir: str = Field(default="runs/train", description="metrics, plot, checkpoints")
    catalog: str | None = Field(default=None, description="catalog folder; None: bundled")
    envs: list[str] | None = Field(default=None, description="envs to train on; None: all")
    tasks: list[int] | None = Field(default=None, description="task indices; None: every "
                                    "task with a verifier")
    jobs: list[tuple[str, int]] | None = Field(default=None, description="(env, task index) to "
                                               "train on, instead of envs x tasks")
    # GRPO
    steps: int = Field(default=3, ge=1, description="train until this many steps are done")
    batch_size: int = Field(default=2, ge=1, description="tasks (groups) per step")
    group_size: int = Field(default=8, ge=2, description="G: rollouts per task")
    lr: float = Field(default=1e-6, gt=0)
    lr_decay_from: int | None = Field(default=None, ge=0, description="from this step on, the "
                                      "learning rate falls linearly, to lr / (steps - "
                                      "lr_decay_from) at the last step (a stable-then-decay "
                                      "schedule); None: constant")
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = Field(default=0.001, ge=0)
    micro_batch: int = Field(default=8, ge=1)
    max_grad_norm: float = 1.0
    mini_batches: int = Field(default=1, ge=1, description="optimizer steps per batch per "
                              "epoch (paper: batch 64 / mini-batch 16 = 4)")
    ppo_epochs: int = Field(default=1, ge=1, description="passes over each rollout batch")
    importance: str = Field(default="token", pattern="^(token|sequence)$",
                            description="token: PPO's per-token ratio and clip; sequence: "
                            "one ratio per sample, the geometric mean of its token ratios, "
                            "clipped at sequence level (GSPO-style, the paper's App. A)")
    # precision and memory at scale
    param_dtype: str = Field(default="float32", pattern="^(float32|bfloat16|float16)$",
                             description="dtype of the trained weights (the optimizer's "
                             "masters); keep float32 and compute in bf16 with `autocast`")
    autocast: str | None = Field(default=None, pattern="^(bfloat16|float16)$",
                                 description="compute dtype of forward/backward (GPU: bfloat16)")
    gradient_checkpointing: bool = Field(default=False, description="recompute the decoder's "
                                         "activations in backward (long prompts, big models)")
    logit_chunk: int = Field(default=1024, ge=1, description="completion positions per "
                             "LM-head chunk")
    branch_at: int | None = Field(
        default=None, ge=0,
        description="branching mode: each group is one episode run to this turn, then forked "
                    "into group_size branches (trainer/branching.py); None: independent rollouts")
    guide_fraction: float = Field(
        default=0.0, ge=0, le=1,
        description="share of each group replaying the task's reference solution instead of "
                    "sampling the model (off-policy guidance; see the config's notes)")
    # agent loop
    window: int | None = Field(default=3, description="history window w; None: whole history")
    max_turns: int = Field(default=20, ge=1)
    max_tool_chars: int = Field(default=8000, ge=100, description="cut longer tool results")
    tool_listing: str = Field(default="full", pattern="^(full|compact|names)$",
                              description="compact: short list_tools answers (small models); "
                              "names: tool names only (tiny CPU models)")
    max_new_tokens: int = Field(default=512, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    group_temperatures: list[float] | None = Field(
        default=None, min_length=1, description="member m of every group samples at "
        "group_temperatures[m % len] (e.g. [0.7, 1.0]: half at each); each sample is trained "
        "under its own temperature. None: every member at `temperature`. Needs batched")
    concurrency: int = Field(default=64, ge=1, description="episodes in flight at once")
    farm_direct: bool = Field(default=False, description="send each lease's requests straight "
                              "to the replica that owns it (a trainer inside the farm's Ray "
                              "cluster, multi-replica pools: past HAProxy and the Door)")
    batched: bool = Field(default=False, description="generate every live episode's turn in one "
                          "batch, in lockstep (trainer.batched: local model; deterministic)")
    max_batch: int = Field(default=64, ge=1, description="batched: rows per forward pass")
    system: str = Field(default="full", pattern="^(full|brief)$", description="the system prompt: full (Qwen3's tool "
                        "listing of the meta-tools) or brief (one sentence: tiny CPU models)")
    # rewards
    reward_path: str = Field(default="code", pattern="^(code|llm)$",
                             description="code: the farm's verify (code-mode verifier decides); "
                             "llm: the paper's code-augmented LLM judge (trainer/judging.py)")
    judge_url: str | None = Field(default=None, description="llm path: a judge service "
                                  "(POST /judge); None: a judge in the trainer process")
    judge_base_url: str | None = Field(default=None, description="llm path, in process: the "
                                       "judge model's OpenAI-compatible endpoint")
    judge_model: str | None = Field(default=None, description="llm path: the judge model")
    # bookkeeping
    checkpoint_every: int = Field(default=1, ge=1)
    keep_checkpoints: int = Field(default=2, ge=1)

    @model_validator(mode="after")
    def _mixed_temperatures(self) -> TrainConfig:
        temps = self.group_temperatures
        if temps is None:
            return self
        if any(t <= 0 for t in temps):
            raise ValueError(f"group_temperatures must all be > 0 (sampled), not {temps}")
        if not self.batched:
            raise ValueError("group_temperatures needs batched: true (the batched policy "
                             "samples each row at its own temperature)")
        if self.branch_at is not None:
            raise ValueError("group_temperatures does not apply to branching groups (branch_at)")
        return self

    def temperature_of(self, member: int) -> float:
        """The sampling temperature of a group's ``member``-th rollout."""
        temps = self.group_temperatures
        return temps[member % len(temps)] if temps else self.temperature

    def lr_at(self, step: int) -> float:
        """The learning rate of GRPO step ``step`` (0-based): a function of the step alone, so a
        resumed run follows the same schedule."""
        start = self.lr_decay_from
        if start is None or step < start or start >= self.steps:
            return self.lr
        return self.lr * (self.steps - step) / (self.steps - start)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of settings")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)
