"""The verl V1 + vLLM check on one GPU: two GRPO steps of a random-init tiny Qwen3 against a farm.

    pip install -e '.[gpu]'          # verl 0.9.1, vLLM (CUDA wheels)
    python -m trainer.gpu_check --out /tmp/gpu_check        # ~5 min on one H100

It saves a random-init Qwen3 (the tiny model's locally trained tokenizer, dimensions vLLM's
attention kernels take) under ``--out``, starts ``envfarm serve --no-ray`` on loopback, writes
the catalog's tasks as verl datasets, and runs ``verl.trainer.main_ppo`` with
``trainer/verl_example.yaml`` (V1 trainer, our agent loop, sequence-level IS) cut down to two
steps of two tasks x two rollouts. It passes when verl exits 0 after logging step 2: the plugin
survived V1's step bookkeeping on real vLLM outputs. ``tests/trainer/test_gpu_check.py`` runs
it where a GPU, verl and vLLM are present, and is skipped (saying so) everywhere else.

Where verl or vLLM is missing (a GPU machine without the ``gpu`` extra) it says which and runs
the native check instead (``--native`` runs it alone): two GRPO steps of envfarm's own trainer
on the GPU (bf16 autocast, fp32 masters) with the same model against an embedded ``--no-ray``
farm, half of each group a reference replay so every group carries an advantage. It passes when
both steps update the model (``update_samples`` > 0, a finite loss) with every tensor on CUDA.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

#: vLLM's attention backends want a head size like 64; the tiny model's 16 is CPU-only
GPU_TINY = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "max_position_embeddings": 16384}
STEPS = 2


def save_gpu_tiny_model(out: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from trainer.tiny_model import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    config = Qwen3Config(vocab_size=len(tokenizer), bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, torch_dtype="bfloat16", **GPU_TINY)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def verl_command(model: Path, data: Path, loop_yaml: Path) -> list[str]:
    from trainer.verl_plugin import EXAMPLE_CONFIG, packaged_config

    example = packaged_config(EXAMPLE_CONFIG)
    return [sys.executable, "-m", "verl.trainer.main_ppo",
            f"--config-path={example.parent}", f"--config-name={example.stem}",
            f"actor_rollout_ref.model.path={model}",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loop_yaml}",
            f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'val.parquet'}",
            "data.train_batch_size=2", "data.max_prompt_length=12288",
            "data.max_response_length=128", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
            "actor_rollout_ref.rollout.agent.num_workers=1",
            f"trainer.total_training_steps={STEPS}", "trainer.save_freq=-1",
            "trainer.test_freq=-1", "trainer.val_before_train=false",
            "trainer.logger=[console]"]


def missing_gpu_stack() -> str | None:
    """Why the verl + vLLM check cannot run here, or None."""
    import importlib.util

    for module in ("verl", "vllm"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[gpu]')"
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU on this machine"


def native_check(out: Path, device: str = "cuda") -> int:
    """Two GRPO steps of envfarm's own trainer on the GPU against an embedded farm."""
    import asyncio
    import json
    import math

    import torch

    from trainer.cli import farm_url
    from trainer.config import TrainConfig
    from trainer.train import train

    on_gpu = device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        print("native check: no CUDA GPU on this machine")
        return 1
    cfg = TrainConfig(model=str(save_gpu_tiny_model(out / "model")), device=device,
                      out_dir=str(out / "native"), steps=STEPS, batch_size=2, group_size=4,
                      guide_fraction=0.5, lr=1e-4, window=3, max_turns=8,
                      max_tool_chars=1000, tool_listing="compact", max_new_tokens=32,
                      autocast="bfloat16" if on_gpu else None,
                      envs=["hotel_booking_1"], concurrency=8)
    started = time.perf_counter()
    with farm_url(None, None, cfg.envs, warm=8) as url:
        records = asyncio.run(train(cfg, url))
    ok = len(records) == STEPS and all(
        r.get("update_samples", 0) > 0 and math.isfinite(r.get("update_loss", math.nan))
        for r in records)
    print(json.dumps({"native_check": "passed" if ok else "FAILED",
                      "device": torch.cuda.get_device_name(0) if on_gpu else device,
                      "torch": torch.__version__,
                      "seconds": round(time.perf_counter() - started, 1),
                      "max_memory_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)
                      if on_gpu else None,
                      "steps": [{k: r.get(k) for k in ("step", "update_samples", "update_loss",
                                                       "update_clip_frac", "reward_mean",
                                                       "rollout_s", "update_s")}
                                for r in records]}, indent=1))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/envfarm_gpu_check"))
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--timeout", type=float, default=1500.0)
    ap.add_argument("--native", action="store_true",
                    help="only the native check (envfarm's own GRPO on the GPU)")
    args = ap.parse_args(argv)
    missing = None if args.native else missing_gpu_stack()
    if args.native or missing:
        if missing:
            print(f"verl V1 + vLLM check skipped: {missing}; running the native check")
        return native_check(args.out)
    from omegaconf import OmegaConf

    from trainer.verl_plugin import packaged_config, write_dataset

    out: Path = args.out
    model = save_gpu_tiny_model(out / "model")
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    write_dataset(data / "train.parquet")
    write_dataset(data / "val.parquet", split="val")
    url = f"http://127.0.0.1:{args.port}"
    loop = OmegaConf.load(packaged_config())
    for entry in loop:  # this farm, and prompts a tiny model's context holds
        entry.farm_url, entry.tool_listing, entry.max_turns = url, "compact", 4
        entry.max_tool_chars = 1000
    loop_yaml = out / "agent_loop.yaml"
    OmegaConf.save(loop, loop_yaml)
    farm_log = (out / "farm.log").open("wb")
    farm = subprocess.Popen([sys.executable, "-m", "envfarm.cli", "serve", "--no-ray",
                             "--host", "127.0.0.1", "--port", str(args.port)],
                            stdout=farm_log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(url, 120)
        log_path = out / "verl.log"
        with log_path.open("wb") as log:
            done = subprocess.run(verl_command(model, data, loop_yaml), stdout=log,
                                  stderr=subprocess.STDOUT, timeout=args.timeout,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)
        text = log_path.read_text(errors="replace")
        reached = re.search(rf"step:{STEPS}\b", text) is not None
        print(f"verl exit {done.returncode}; step {STEPS} logged: {reached}; log: {log_path}")
        return 0 if done.returncode == 0 and reached else 1
    finally:
        farm.terminate()
        farm.wait(30)
        farm_log.close()


def _wait_healthy(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as res:
                if res.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"farm at {url} not healthy after {timeout_s:.0f} s")
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
