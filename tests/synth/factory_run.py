"""A run folder with a bundled env's tool graph and sampled chains, and QueryGen's scripted answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from envfarm import EnvRuntime, load_catalog
from synth._jsonl import JsonlStore
from synth.factory.chains import sample_chains
from synth.factory.dbvalues import db_columns
from synth.factory.graph import build_graph, factory_dir, save_graph
from synth.factory.run import CHAINS_FILE
from tests.fakes.mock_openai import MockOpenAI, SeenRequest

ENV = "hotel_booking_1"
def request(first: str = "I'd like to sort out my trip plans in my account, please."):
    """A QueryGen answer with one message per planned turn, ``first`` first (names no tool, no id
    unless ``first`` does); well-formed, but no agent can act on it."""
    from tests.fakes.factory_agent import query_prompt_of, staged_messages, turn_sizes

    def answer(req: SeenRequest) -> str:
        sizes = turn_sizes(query_prompt_of(req)) or [1]
        return staged_messages([first, *(["And tell me when that's done."] * (len(sizes) - 1))], sizes)

    return answer


def prepare_run(out: Path, n: int = 10, seed: int = 0) -> list:
    """Graph (names only, no LLM) and ``n`` chains of ``ENV`` under ``out``; the chains."""
    runtime = EnvRuntime(load_catalog()[ENV])
    graph = asyncio.run(build_graph(runtime, embedder=None))
    save_graph(graph, out)
    chains = sample_chains(graph, db_columns(runtime.template.data), n=n, max_len=3, seed=seed)
    store = JsonlStore(factory_dir(out, ENV) / CHAINS_FILE, lambda r: r["chain_id"])
    for c in chains:
        store.append_once(c.model_dump(mode="json"))
    return chains


def script_queries(mock: MockOpenAI) -> None:
    """A scripted QueryGen and agent on ``mock`` (``tests.fakes.factory_agent``), registered for the CLI."""
    from tests.fakes.factory_agent import script_world

    script_world(mock)


def queries_args(mock: MockOpenAI, out: Path) -> list[str]:
    return ["queries", "--out", str(out), "--env", ENV, "--llm-base-url", mock.url, "--llm-model", "mock",
            "--no-cache"]

