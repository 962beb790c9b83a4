"""Fixtures of the EnvFactory tests (tests/synth/test_factory_*.py)."""

from __future__ import annotations

import asyncio

import pytest

from envfarm import EnvRuntime
from judge import VerifierSandbox
from synth.factory.chains import sample_chains
from synth.factory.dbvalues import db_columns
from synth.factory.graph import build_graph
from tests.synth.factory_env import lending_bundle


@pytest.fixture(scope="module")
def sandbox():
    with VerifierSandbox(workers=2, timeout_s=10.0) as sb:
        yield sb


@pytest.fixture(scope="module")
def lending_chains():
    """The lending env's runtime, DB columns and 10 chains (names-only graph, seed 0)."""
    runtime = EnvRuntime(lending_bundle())
    graph = asyncio.run(build_graph(runtime, embedder=None))
    columns = db_columns(runtime.template.data)
    return runtime, columns, sample_chains(graph, columns, n=10, max_len=3, seed=0)
