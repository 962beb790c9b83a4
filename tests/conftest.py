"""Shared fixtures: real AWM samples, the bundled catalog, a toy env that misbehaves on purpose."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.mock_openai import MockOpenAI

REPO = Path(__file__).resolve().parents[1]
AWM_SAMPLES = REPO.parent / "shared" / "awm1k_samples"


@pytest.fixture(scope="session")
def awm_samples() -> Path:
    if not (AWM_SAMPLES / "gen_envs.jsonl").is_file():
        pytest.skip(f"real AWM samples not found at {AWM_SAMPLES} (../shared beside the repo)")
    return AWM_SAMPLES


@pytest.fixture(scope="session")
def awm_catalog(awm_samples):
    from envfarm import load_catalog

    return load_catalog(awm_samples)


@pytest.fixture(scope="session")
def bundled_catalog():
    from envfarm import load_catalog

    return load_catalog()


@pytest.fixture
def mock_openai() -> Iterator[MockOpenAI]:
    """A running scripted OpenAI-compatible server on 127.0.0.1 (see tests/fakes/mock_openai.py)."""
    with MockOpenAI() as server:
        yield server
