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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import typer
from typer import _click as click  # typer ships its own click; its parser raises these classes
from typer.core import TyperCommand

from envfarm.errors import EnvfarmError
from synth._llm_options import LLM_OPTIONS, llm_config, with_llm_options
from synth.config import STAGES
from synth.factory import cli as factory_cli

if TYPE_CHECKING:
    from synth.factory.export import SftFormat
    from synth.factory.gate import AgentLoop

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
        seed_file: Path = typer.Option(None, help="seed scenarios JSONL [default: the packaged list]"),
        target_count: int = typer.Option(10, help="scenarios to synthesize"),
        tasks_per_scenario: int = typer.Option(10, "--tasks-per-scenario", "-k", help="tasks per scenario"),
        concurrency: int = typer.Option(8, help="scenarios in flight"),
        max_attempts: int = typer.Option(5, help="self-correction attempts per stage"),
        embedder: str = typer.Option("local", help="dedup embeddings: local | endpoint | none"),
        gate: bool = typer.Option(True, "--gate/--no-gate", help="acceptance gate with reference solutions"),
        retry_failed: bool = typer.Option(False, help="re-run stages that failed in an earlier run"),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar per stage"),
        **llm_options: Any,
    ) -> None:
        from synth.config import SynthConfig
        from envfarm.llm import LLMClient
        from synth.pipeline import run_pipeline
        from synth.report import render_tables

        try:
            llm_cfg = llm_config(out, **llm_options)
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

    return with_llm_options(command, at=1)  # after --out


def report(
    out: Path = typer.Option(Path("synth_out"), "--out", "-o", help="run folder"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
) -> None:
    from synth.report import render_tables, report_json

    if not out.is_dir():
        typer.echo(f"error: {out} is not a run folder", err=True)
        raise typer.Exit(2)
    typer.echo(report_json(out) if as_json else render_tables(out))


def guard(
    catalog: Path = typer.Argument(None, help="catalog folder; default: the bundled catalog"),
    env: list[str] = typer.Option([], "--env", help="only this env, repeatable"),
    write: bool = typer.Option(False, "--write", help="rewrite gen_verifier.pure_code.jsonl in place"),
) -> None:
    from envfarm.catalog import load_catalog
    from envfarm.confined.runtime import EnvRuntime
    from synth.guard import guard_env, read_written_tables, rewrite_verifiers

    cat = load_catalog(catalog)
    for name in [cat[n].name for n in env] or cat.servable:
        runtime = EnvRuntime(cat[name])
        ignore = asyncio.run(read_written_tables(runtime))
        guarded = asyncio.run(guard_env(runtime, ignore))
        where = rewrite_verifiers(cat, name, guarded) if write and guarded else []
        typer.echo(f"{name}: {len(guarded)} verifier(s) guarded" + (f" (reads write: {sorted(ignore)})" if ignore else "")
                   + (f"; wrote {', '.join(str(p) for p in where)}" if where else ""))


def make_app(agent_loop: AgentLoop | None = None,
             sft_formats: Mapping[str, SftFormat] | None = None) -> typer.Typer:
    """``envfarm synth``'s commands. What synth needs of the trainer (synth sits below it) comes
    in here, from the composition root (``cluster.cli``): ``agent_loop`` turns ``queries``'
    ``--agent-*`` options into the agent that must solve each written request; ``sft_formats``
    are ``export``'s SFT formats besides OpenAI's."""
    app = typer.Typer(help="Synthesize AWM-format environments with any OpenAI-compatible LLM.",
                      no_args_is_help=True)
    for stage in STAGES:
        app.command(stage, help=_STAGE_HELP[stage], cls=_StageCommand)(_make_command((stage,)))
    app.command("all", help=_STAGE_HELP["all"], cls=_StageCommand)(_make_command(STAGES))
    factory_cli.register(app, agent_loop=agent_loop, sft_formats=sft_formats)
    app.command("report", help="Print Table 1 (per stage) and Table 2 (per env) of a run folder.")(report)
    app.command("guard", help="Wrap each code-mode verifier that has a reference solution so that it also "
                "fails an episode that changes rows the task never touches (synth/guard.py).")(guard)
    return app


#: synth alone (``python -m synth.cli``): ``queries`` says it needs an agent loop handed in.
app = make_app()

if __name__ == "__main__":
    app(prog_name="envfarm synth")
    sys.exit(0)
