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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/envfarm_gpu_check"))
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--timeout", type=float, default=1500.0)
    args = ap.parse_args(argv)
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
