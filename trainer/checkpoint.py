"""Checkpoints: model + optimizer + step, written so that a kill -9 at any moment leaves the
last complete one usable (each is built in a temporary folder, then renamed; ``latest`` is
replaced atomically)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

LATEST = "latest"


def save(root: Path, step: int, model: Any, tokenizer: Any, optimizer: Any,
         extra: dict[str, Any] | None = None, keep: int = 2) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state()},
               tmp / "trainer_state.pt")
    (tmp / "step.json").write_text(json.dumps({"step": step, **(extra or {})}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    pointer = root / (LATEST + ".tmp")
    pointer.write_text(final.name)
    os.replace(pointer, root / LATEST)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(root: Path) -> Path | None:
    """The last complete checkpoint, or None."""
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "step.json").is_file() else None


def step_of(path: Path) -> int:
    return int(json.loads((path / "step.json").read_text())["step"])


def restore_optimizer(path: Path, optimizer: Any) -> None:
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
