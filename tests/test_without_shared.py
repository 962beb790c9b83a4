"""A checkout without ../shared (the real AWM samples) skips the tests that read them, saying
why, instead of erroring: run a copy of the repo where no ../shared sits beside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Tests that read the samples: judge fixtures (awm_cases), the AWM catalog, the judge CLI.
USERS = ["tests/judge/test_verifier_sandbox.py::test_awm_code_verifiers",
         "tests/judge/test_verifier_sandbox.py::test_awm_sql_verifier_facts",
         "tests/judge/test_judge_cli.py", "tests/judge/test_judge_service.py::test_post_one",
         "tests/envfarm/farm/test_awm_samples.py"]


@pytest.mark.slow
def test_tests_skip_with_a_reason_without_shared(tmp_path):
    copy = tmp_path / "repo"
    for name in ("envfarm", "judge", "synth", "tests"):
        shutil.copytree(REPO / name, copy / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.db"))
    shutil.copy(REPO / "pyproject.toml", copy)
    assert not (tmp_path / "shared").exists()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          *USERS], cwd=copy, capture_output=True, text=True, timeout=240)
    tail = run.stdout[-3000:]
    assert run.returncode == 0, tail
    assert "error" not in tail.splitlines()[-1] and "passed" not in tail.splitlines()[-1], tail
    assert f"real AWM samples not found at {tmp_path / 'shared' / 'awm1k_samples'}" in tail
