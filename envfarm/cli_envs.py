"""`envfarm envs list|show|check [PATH]`: look into a catalog (the bundled one by default)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from envfarm.catalog import load_catalog
from envfarm.check import EnvReport, check_env
from envfarm.cli_hacks import print_hacks, probe_catalog_env, quarantine_app, write_flags
from envfarm.errors import EnvfarmError, EnvLoadError
from envfarm.runtime import EnvRuntime

app = typer.Typer(help="Inspect and check environment catalogs (AWM JSONL folders).",
                  no_args_is_help=True)
app.add_typer(quarantine_app, name="quarantine")
console = Console(soft_wrap=True)

CatalogPath = Annotated[Optional[Path], typer.Argument(
    help="Catalog folder of AWM JSONL files; omitted = the catalog bundled with envfarm.")]


def _load(path: Path | None):
    try:
        return load_catalog(path)
    except EnvfarmError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(2) from exc


@app.command("list")
def list_envs(path: CatalogPath = None,
              as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the environments of a catalog."""
    catalog = _load(path)
    rows = [{"name": b.name, "servable": b.servable, "tasks": len(b.tasks),
             "solutions": len(b.solutions), "problems": b.problems}
            for b in (catalog[n] for n in catalog.names)]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("env", "servable", "tasks", "solutions", "problems")
    for r in rows:
        table.add_row(r["name"], "yes" if r["servable"] else "no", str(r["tasks"]),
                      str(r["solutions"]), str(len(r["problems"])))
    console.print(table)
    for problem in catalog.problems:
        console.print(f"[yellow]catalog:[/yellow] {problem}")


@app.command("show")
def show_env(name: str, path: CatalogPath = None,
             as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Show one environment: tasks, tools and problems."""
    catalog = _load(path)
    try:
        bundle = catalog[name]
    except EnvfarmError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(2) from exc
    tools, problems = [], list(bundle.problems)
    if bundle.servable:
        try:
            runtime = EnvRuntime(bundle)
            tools = runtime.tools
            problems += runtime.problems
        except EnvLoadError as exc:
            problems.append(exc.message)
    if as_json:
        typer.echo(json.dumps({"name": bundle.name, "description": bundle.description,
                               "tasks": bundle.tasks, "tools": [t.model_dump() for t in tools],
                               "problems": problems}, indent=2))
        return
    console.print(f"[bold]{bundle.name}[/bold]  {bundle.description}")
    for i, task in enumerate(bundle.tasks):
        console.print(f"  task {i}: {task}")
    for tool in tools:
        first = tool.description.splitlines()[0] if tool.description else ""
        console.print(f"  tool [cyan]{tool.name}[/cyan]({', '.join(tool.input_schema.get('properties', {}))}) {first}")
    for problem in problems:
        console.print(f"  [yellow]problem:[/yellow] {problem}")


@app.command("check")
def check_envs(
    path: CatalogPath = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of reports.")] = False,
    env: Annotated[Optional[list[str]], typer.Option(help="Only these envs.")] = None,
    probe: Annotated[bool, typer.Option(help="Also call every tool with example arguments.")] = False,
    hacks: Annotated[bool, typer.Option(help=(
        "Also run the hack probes on every task with a verifier (envfarm.hackprobes): no-op, "
        "echo, guesses, a dump, a destructive write beside the reference, the reference minus "
        "its last write."))] = False,
    write_flags_: Annotated[bool, typer.Option("--write-flags", help=(
        "With --hacks: write gen_probes.jsonl at the catalog's root; a farm quarantines the "
        "tasks it flags at load."))] = False,
    judge_base_url: Annotated[Optional[str], typer.Option(help=(
        "With --hacks: also probe the LLM-judge path, with this OpenAI-compatible judge."))] = None,
    judge_model: Annotated[Optional[str], typer.Option(help="The judge model.")] = None,
) -> None:
    """Load every env, build its DB, list its tools and run each reference solution.

    Exits non-zero when a servable env fails to load.
    """
    catalog = _load(path)
    names = [catalog[n].name for n in env] if env else catalog.names
    llm = {"base_url": judge_base_url, "model": judge_model} if judge_base_url else None
    reports, probes = asyncio.run(_check_all(catalog, names, probe, hacks, llm))
    if as_json:
        typer.echo(json.dumps([r.summary() for r in reports], indent=2))
    else:
        _print_reports(reports)
        print_hacks(reports)
    if write_flags_ and hacks:
        written = write_flags(catalog.root, catalog, probes)
        if not as_json:
            console.print(f"wrote {written}: {sum(len(r.hackable) for r in reports)} task(s) flagged")
    failed = [r.name for r in reports if not r.loaded and catalog[r.name].servable]
    if failed:
        if not as_json:
            console.print(f"[red]{len(failed)} env(s) failed to load:[/red] {', '.join(failed)}")
        raise typer.Exit(1)


async def _check_all(catalog, names: list[str], probe: bool, hacks: bool = False,
                     llm: dict | None = None) -> tuple[list[EnvReport], list]:
    from judge import Judge, JudgeConfig, VerifierSandbox

    with VerifierSandbox() as sandbox:
        judges = [Judge(JudgeConfig(use_llm="never"), sandbox=sandbox)]
        if hacks and llm:
            from envfarm.llm import LLMClient, LLMConfig

            judges.append(Judge(JudgeConfig(use_llm="always"), sandbox=sandbox,
                                llm_client=LLMClient(LLMConfig.from_env(**{k: v for k, v in llm.items() if v}))))
        reports, probes = [], []
        for name in names:
            bundle = catalog[name]
            runtime = None
            if not bundle.servable:
                report = EnvReport(name=name, loaded=False, tasks=len(bundle.tasks),
                                   problems=list(bundle.problems))
            else:
                try:
                    runtime = EnvRuntime(bundle)
                except EnvLoadError:
                    runtime = None
                report = await check_env(bundle, sandbox, probe=probe, runtime=runtime)
            if hacks and (runtime is not None or not bundle.servable):
                probes += await probe_catalog_env(catalog, name, report, runtime, judges)
            reports.append(report)
        for judge in judges:
            await judge.aclose()
        return reports, probes


def _print_reports(reports: list[EnvReport]) -> None:
    table = Table("env", "loaded", "tables", "rows", "tools", "tasks", "solvable", "build ms",
                  "problems", "defects", "probed", "hackable")
    for r in reports:
        table.add_row(r.name, "yes" if r.loaded else "no", str(r.tables), str(r.rows),
                      str(r.tools), str(r.tasks), str(r.solvable), f"{r.build_ms:.0f}",
                      str(len(r.problems)), str(len(r.defects)), str(r.probed), str(len(r.hackable)))
    console.print(table)
    for r in reports:
        for problem in r.problems:
            console.print(f"  [yellow]{r.name}:[/yellow] {problem}")
        for defect in r.defects:
            console.print(f"  [dim]{r.name} (defect):[/dim] {defect}")
        if r.module_state:
            console.print(f"  [yellow]{r.name} (module state):[/yellow] tool calls change "
                          f"{', '.join(r.module_state)}: served with a worker per lease")
