"""Where the benchmarks find real AgentWorldModel-1K samples (the public AWM data set's
``gen_envs.jsonl``, ``gen_tasks.jsonl``, ``gen_verifier*.jsonl``, ...). They are not shipped with
envfarm: point ``ENVFARM_AWM_SAMPLES`` at a folder of them. A benchmark that needs them and finds
none stops with this message; the ones where they are optional say so and go on without."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "ENVFARM_AWM_SAMPLES"
_CHECKOUT_SIBLING = Path(__file__).resolve().parents[2] / "shared" / "awm1k_samples"


def awm_samples() -> Path:
    """The samples folder: ``$ENVFARM_AWM_SAMPLES``, else one beside the checkout (CI's layout)."""
    return Path(os.environ.get(ENV_VAR) or _CHECKOUT_SIBLING)


def have_awm_samples() -> bool:
    return (awm_samples() / "gen_envs.jsonl").is_file()


def require_awm_samples() -> Path:
    if not have_awm_samples():
        raise SystemExit(f"this benchmark reads real AgentWorldModel-1K samples: set {ENV_VAR} to a "
                         f"folder holding gen_envs.jsonl, gen_tasks.jsonl and gen_verifier.jsonl "
                         f"(looked in {awm_samples()})")
    return awm_samples()
