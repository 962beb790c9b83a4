"""The verl V1 + vLLM check (``python -m cluster.gpu_check``): two GRPO steps of a random-init
tiny Qwen3 against a farm. It needs one CUDA GPU and the ``gpu`` extra (verl 0.9.1, vLLM);
where either is missing it is skipped, saying which."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


def _missing() -> str | None:
    for module in ("verl", "vllm"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[gpu]' on a GPU machine)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    return None


@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_two_verl_v1_steps_on_one_gpu(tmp_path):
    done = subprocess.run([sys.executable, "-m", "cluster.gpu_check", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=1800, check=False)
    log = (tmp_path / "verl.log").read_text(errors="replace")[-4000:] if (
        tmp_path / "verl.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log
