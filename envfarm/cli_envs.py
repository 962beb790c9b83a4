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
from envfarm.errors import EnvfarmError, EnvLoadError
from envfarm.runtime import EnvRuntime

app = typer.Typer(help="Inspect and check environment catalogs (AWM JSONL folders).",
                  no_args_is_help=True)
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
) -> None:
    """Load every env, build its DB, list its tools and run each reference solution.

    Exits non-zero when a servable env fails to load.
    """
    catalog = _load(path)
    names = [catalog[n].name for n in env] if env else catalog.names
    reports = asyncio.run(_check_all(catalog, names, probe))
    if as_json:
        typer.echo(json.dumps([r.summary() for r in reports], indent=2))
    else:
        _print_reports(reports)
    failed = [r.name for r in reports if not r.loaded and catalog[r.name].servable]
    if failed:
        if not as_json:
            console.print(f"[red]{len(failed)} env(s) failed to load:[/red] {', '.join(failed)}")
        raise typer.Exit(1)


async def _check_all(catalog, names: list[str], probe: bool) -> list[EnvReport]:
    from judge import VerifierSandbox

    with VerifierSandbox() as sandbox:
        reports = []
        for name in names:
            bundle = catalog[name]
            if not bundle.servable:
                reports.append(EnvReport(name=name, loaded=False, tasks=len(bundle.tasks),
                                         problems=list(bundle.problems)))
                continue
            reports.append(await check_env(bundle, sandbox, probe=probe))
        return reports


def _print_reports(reports: list[EnvReport]) -> None:
    table = Table("env", "loaded", "tables", "rows", "tools", "tasks", "solvable", "build ms",
                  "problems", "defects")
    for r in reports:
        table.add_row(r.name, "yes" if r.loaded else "no", str(r.tables), str(r.rows),
                      str(r.tools), str(r.tasks), str(r.solvable), f"{r.build_ms:.0f}",
                      str(len(r.problems)), str(len(r.defects)))
    console.print(table)
    for r in reports:
        for problem in r.problems:
            console.print(f"  [yellow]{r.name}:[/yellow] {problem}")
        for defect in r.defects:
            console.print(f"  [dim]{r.name} (defect):[/dim] {defect}")
        if r.module_state:
            console.print(f"  [yellow]{r.name} (module state):[/yellow] tool calls change "
                          f"{', '.join(r.module_state)}: served with a worker per lease")
