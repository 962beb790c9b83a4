"""``envfarm synth``: one subcommand per stage, ``all``, and ``report`` (Table 1 / Table 2).

Every stage command reads and appends the AWM JSONL files under ``--out`` and can be re-run or
resumed at any time: finished work is skipped, and cached LLM answers cost nothing. Each stage
command takes only the options that change what it does (``STAGE_OPTIONS``); ``all`` takes them all,
and an option a stage would ignore is a usage error (exit 2), not silently dropped.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path
from typing import Any

import typer
from typer import _click as click  # typer ships its own click; its parser raises these classes
from typer.core import TyperCommand

from envfarm.errors import EnvfarmError

app = typer.Typer(help="Synthesize AWM-format environments with any OpenAI-compatible LLM.", no_args_is_help=True)

_STAGE_HELP = {
    "scenario": "Self-Instruct scenario expansion from seeds (classifier, dedup, category caps).",
    "task": "k concrete, API-solvable tasks per scenario.",
    "db": "SQLite schema, executed; accepted when <= 10 % of tables fail.",
    "sample": "Sample rows inserted in FK order; accepted when <= 10 % of inserts fail.",
    "spec": "Toolset spec (operation ids, typed params, responses) covering every task.",
    "env": "FastAPI + SQLAlchemy env code; must load, list tools and answer example calls.",
    "verifier": "Per-task sql/code verifiers run in the sandbox, then the acceptance gate.",
    "all": "Every stage, streaming scenarios through them concurrently.",
}


def _parse_pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key or not val:
            raise EnvfarmError(f"{what} must look like KEY=VALUE, got {v!r}")
        out[key] = val
    return out


def llm_config(out: Path, *, llm_base_url: str | None, llm_model: str | None, llm_api_key: str | None,
               stage_model: list[str], price: list[str], llm_concurrency: int, llm_replay: Path | None,
               llm_record: Path | None, cache_dir: Path | None, no_cache: bool) -> Any:
    """The ``envfarm.llm.LLMConfig`` of the LLM options every LLM-using command takes."""
    from envfarm.llm import LLMConfig, Price

    prices = {}
    for model, spec in _parse_pairs(price, "--price").items():
        inp, _, outp = spec.partition("/")
        prices[model] = Price(input_per_mtok=float(inp), output_per_mtok=float(outp or 0))
    cfg = LLMConfig.from_env(
        base_url=llm_base_url, model=llm_model, api_key=llm_api_key,
        stage_models=_parse_pairs(stage_model, "--stage-model") or None,
        max_concurrency=llm_concurrency, replay_path=llm_replay, record_path=llm_record,
        cache_dir=None if no_cache else (cache_dir or out / "llm_cache"),
    )
    cfg.prices.update(prices)
    return cfg


#: The LLM endpoint options (``llm_config``'s keywords), shared by every command that calls the LLM.
LLM_OPTIONS = ("llm_base_url", "llm_model", "llm_api_key", "stage_model", "price", "llm_concurrency",
               "llm_replay", "llm_record", "cache_dir", "no_cache")


def llm_option_parameters() -> list[inspect.Parameter]:
    """The ``LLM_OPTIONS`` parameters (typer options) of the stage commands, for other commands' signatures."""
    sig = inspect.signature(_full_command(()), eval_str=True)
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values() if p.name in LLM_OPTIONS]


#: Options every stage command takes: the run folder, the LLM endpoint and its bookkeeping.
COMMON_OPTIONS = ("out", *LLM_OPTIONS, "progress")
#: Options of the stages that walk scenarios one by one with a self-correction loop.
_PER_SCENARIO = ("concurrency", "max_attempts", "retry_failed")
#: Stage -> the options (besides ``COMMON_OPTIONS``) that apply to it.
STAGE_OPTIONS: dict[str, tuple[str, ...]] = {
    "scenario": ("seed_file", "target_count", "embedder"),
    "task": ("tasks_per_scenario", *_PER_SCENARIO),
    "db": _PER_SCENARIO,
    "sample": _PER_SCENARIO,
    "spec": _PER_SCENARIO,
    "env": _PER_SCENARIO,
    "verifier": ("gate", *_PER_SCENARIO),
}


class _StageCommand(TyperCommand):
    """Says which commands take an option this one does not."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoSuchOption as exc:
            owners = [s for s, opts in STAGE_OPTIONS.items()
                      if any(exc.option_name in _flag_names(o) for o in opts)]
            if not owners:
                raise
            raise click.exceptions.UsageError(f"{exc.option_name} does not apply to the {self.name!r} stage; it is an "
                                   f"option of: {', '.join([*owners, 'all'])}", ctx) from None


def _flag_names(param: str) -> set[str]:
    flag = "--" + param.replace("_", "-")
    return {flag, *_EXTRA_FLAGS.get(param, ())}


_EXTRA_FLAGS = {"gate": ("--no-gate",), "tasks_per_scenario": ("-k",), "retry_failed": ("--no-retry-failed",)}


def _make_command(stages: tuple[str, ...]) -> Any:
    """The command for ``stages``, taking only the options that apply to them."""
    full = _full_command(stages)
    sig = inspect.signature(full, eval_str=True)
    allowed = set(COMMON_OPTIONS).union(*(STAGE_OPTIONS.get(s, ()) for s in stages))
    kept = [p for p in sig.parameters.values() if p.name in allowed]
    fixed = {p.name: p.default.default for p in sig.parameters.values() if p.name not in allowed}

    def command(**kwargs: Any) -> None:
        full(**fixed, **kwargs)

    command.__signature__ = sig.replace(parameters=kept)  # type: ignore[attr-defined]
    command.__doc__ = full.__doc__
    return command


def _full_command(stages: tuple[str, ...]) -> Any:
    def command(
        out: Path = typer.Option(Path("synth_out"), "--out", "-o", help="run folder of AWM JSONL files"),
        llm_base_url: str = typer.Option(None, help="OpenAI-compatible base URL [env ENVFARM_LLM_BASE_URL]"),
        llm_model: str = typer.Option(None, help="default model [env ENVFARM_LLM_MODEL]"),
        llm_api_key: str = typer.Option(None, help="API key [env ENVFARM_LLM_API_KEY]"),
        stage_model: list[str] = typer.Option([], help="STAGE=MODEL, repeatable (e.g. env=gpt-5)"),
        price: list[str] = typer.Option([], help="MODEL=IN/OUT USD per 1M tokens, repeatable"),
        llm_concurrency: int = typer.Option(32, help="LLM calls in flight"),
        llm_replay: Path = typer.Option(None, help="serve LLM answers from this recording (offline)"),
        llm_record: Path = typer.Option(None, help="append every live LLM call to this recording"),
        cache_dir: Path = typer.Option(None, help="response cache folder [default: OUT/llm_cache]"),
        no_cache: bool = typer.Option(False, "--no-cache", help="do not cache LLM responses"),
        seed_file: Path = typer.Option(None, help="seed scenarios JSONL [default: the packaged list]"),
        target_count: int = typer.Option(10, help="scenarios to synthesize"),
        tasks_per_scenario: int = typer.Option(10, "--tasks-per-scenario", "-k", help="tasks per scenario"),
        concurrency: int = typer.Option(8, help="scenarios in flight"),
        max_attempts: int = typer.Option(5, help="self-correction attempts per stage"),
        embedder: str = typer.Option("local", help="dedup embeddings: local | endpoint | none"),
        gate: bool = typer.Option(True, "--gate/--no-gate", help="acceptance gate with reference solutions"),
        retry_failed: bool = typer.Option(False, help="re-run stages that failed in an earlier run"),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar per stage"),
    ) -> None:
        from synth.config import SynthConfig
        from envfarm.llm import LLMClient
        from synth.pipeline import run_pipeline
        from synth.report import render_tables

        try:
            llm_cfg = llm_config(out, llm_base_url=llm_base_url, llm_model=llm_model, llm_api_key=llm_api_key,
                                 stage_model=stage_model, price=price, llm_concurrency=llm_concurrency,
                                 llm_replay=llm_replay, llm_record=llm_record, cache_dir=cache_dir, no_cache=no_cache)
            config = SynthConfig(
                out_dir=out, seed_file=seed_file, target_count=target_count, tasks_per_scenario=tasks_per_scenario,
                concurrency=concurrency, max_attempts=max_attempts, embedder=embedder, gate=gate,
                retry_failed=retry_failed, progress=progress,
            )
            llm = LLMClient(llm_cfg)

            async def main() -> Any:
                async with llm:
                    return await run_pipeline(config, llm, stages)

            summary = asyncio.run(main())
        except EnvfarmError as exc:
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(2) from None
        except ValueError as exc:  # pydantic validation of flags
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(render_tables(out))
        total = summary.usage.get("total", {})
        unverified = (f", {summary.envs_with_unverified_tasks} with unverified tasks (gate skipped)"
                      if summary.envs_with_unverified_tasks else "")
        typer.echo(f"\n{summary.envs} envs ({summary.envs_with_solvable_tasks} with solvable tasks{unverified}) in {out}; "
                   f"{summary.elapsed_s:.1f} s; LLM calls {total.get('calls', 0)} "
                   f"({total.get('cached_calls', 0)} cached), cost ${total.get('cost_usd', 0.0):.4f}")
        for err in summary.errors:
            typer.echo(f"interrupted: {err}", err=True)
        if summary.errors:
            raise typer.Exit(1)

    return command


from synth.config import STAGES as _STAGES  # noqa: E402 - after the factory on purpose

for _stage in _STAGES:
    app.command(_stage, help=_STAGE_HELP[_stage], cls=_StageCommand)(_make_command((_stage,)))
app.command("all", help=_STAGE_HELP["all"], cls=_StageCommand)(_make_command(_STAGES))


from synth.factory.cli import register as _register_factory  # noqa: E402 - needs llm_config above

_register_factory(app)


@app.command("report", help="Print Table 1 (per stage) and Table 2 (per env) of a run folder.")
def report(
    out: Path = typer.Option(Path("synth_out"), "--out", "-o", help="run folder"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
) -> None:
    from synth.report import render_tables, report_json

    if not out.is_dir():
        typer.echo(f"error: {out} is not a run folder", err=True)
        raise typer.Exit(2)
    typer.echo(report_json(out) if as_json else render_tables(out))


@app.command("guard", help="Wrap each code-mode verifier that has a reference solution so that it "
             "also fails an episode that changes rows the task never touches (synth/guard.py).")
def guard(
    catalog: Path = typer.Argument(None, help="catalog folder; default: the bundled catalog"),
    env: list[str] = typer.Option([], "--env", help="only this env, repeatable"),
    write: bool = typer.Option(False, "--write", help="rewrite gen_verifier.pure_code.jsonl in place"),
) -> None:
    from envfarm.catalog import load_catalog
    from envfarm.runtime import EnvRuntime
    from synth.guard import guard_env, read_written_tables, rewrite_verifiers

    cat = load_catalog(catalog)
    for name in [cat[n].name for n in env] or cat.servable:
        runtime = EnvRuntime(cat[name])
        ignore = asyncio.run(read_written_tables(runtime))
        guarded = asyncio.run(guard_env(runtime, ignore))
        where = rewrite_verifiers(cat, name, guarded) if write and guarded else []
        typer.echo(f"{name}: {len(guarded)} verifier(s) guarded" + (f" (reads write: {sorted(ignore)})" if ignore else "")
                   + (f"; wrote {', '.join(str(p) for p in where)}" if where else ""))


if __name__ == "__main__":
    app(prog_name="envfarm synth")
    sys.exit(0)
