"""`envfarm envs check --hacks` (the hack probes over a catalog, flags written beside it) and
`envfarm envs quarantine list|lift` (a running farm's tasks out of rotation)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from envfarm.catalog import Catalog, verifier_sha256
from envfarm.check import EnvReport
from envfarm.client import Farm
from envfarm.errors import EnvfarmError
from envfarm.hackprobes import HackReport, bundle_tasks, probe_tasks
from envfarm.runtime import EnvRuntime

PROBES_FILE = "gen_probes.jsonl"
console = Console(soft_wrap=True)


async def probe_catalog_env(catalog: Catalog, name: str, report: EnvReport, runtime: EnvRuntime | None,
                            judges: list[Any]) -> list[HackReport]:
    """Every task of one env through the probes on each judge's path; ``report`` gets the
    count and the tasks a probe passes. ``runtime`` None: an env without code (its database
    only: built from the catalog's schema and data)."""
    bundle = catalog[name]
    initial = None
    if runtime is None:
        from envfarm.template import build_template

        initial = build_template(bundle.db_schema, bundle.sample_data).data
    tasks = [t.model_copy(update={"initial_db": initial}) for t in bundle_tasks(bundle)]
    out: list[HackReport] = []
    for judge in judges:
        out += await probe_tasks(runtime, tasks, judge, env=name)
    report.probed = len(tasks)
    for r in out:
        if r.rejects and r.task_idx is not None:
            report.hackable[r.task_idx] = "; ".join(x for x in (report.hackable.get(r.task_idx), r.summary()) if x)
    return out


def write_flags(root: Path, catalog: Catalog, reports: list[HackReport]) -> Path:
    """``gen_probes.jsonl`` at the catalog's root: one record per task and path probed (this
    run's envs replace their old records; other envs' stay). The loader flags the tasks a
    probe passes, and a farm quarantines them at load."""
    path = root / PROBES_FILE
    envs = {r.env for r in reports}
    kept = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("scenario") not in envs:
                kept.append(rec)
    fresh = [{"scenario": r.env, "task_idx": r.task_idx, "path": r.path,
              "hacked": [p.value for p in r.hacked], "undecided": [p.value for p in r.undecided],
              "summary": r.summary(), "verifier_sha256": verifier_sha256(catalog[r.env], r.task_idx)}
             for r in reports if r.task_idx is not None]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(rec) + "\n" for rec in kept + fresh), encoding="utf-8")
    os.replace(tmp, path)
    return path


def print_hacks(reports: list[EnvReport]) -> None:
    for r in reports:
        for idx, why in sorted(r.hackable.items()):
            console.print(f"  [red]{r.name} task {idx} (hackable):[/red] {why}")


# -- envfarm envs quarantine ------------------------------------------------------------------
quarantine_app = typer.Typer(help="A running farm's tasks out of rotation (env errors, invalid "
                                  "verdicts, flagged at load).", no_args_is_help=True)
FarmUrl = Annotated[str, typer.Option("--farm", help="The farm's URL.")]
KeyOpt = Annotated[str | None, typer.Option("--farm-key", envvar="ENVFARM_API_KEY",
                                            help="A tenant's farm API key (lifting needs one "
                                                 "where leasing does).")]


def _table(entries: list[Any]) -> None:
    table = Table("env", "task", "source", "why")
    for q in entries:
        table.add_row(q.env, "all" if q.task_idx is None else str(q.task_idx), q.source, q.reason)
    console.print(table)


def _run(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except EnvfarmError as exc:
        console.print(f"[red]error:[/red] {type(exc).__name__}: {exc.message}")
        raise typer.Exit(1) from exc


@quarantine_app.command("list")
def list_quarantine(farm: FarmUrl = "http://127.0.0.1:8000", key: KeyOpt = None,
                    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the quarantined tasks and why."""
    async def go() -> list[Any]:
        async with Farm(farm, api_key=key) as client:
            return await client.quarantined()

    entries = _run(go())
    if as_json:
        typer.echo(json.dumps([q.model_dump() for q in entries], indent=2))
    elif entries:
        _table(entries)
    else:
        console.print("no task is quarantined")


@quarantine_app.command("lift")
def lift_quarantine(env: str, task: Annotated[int | None, typer.Option(
        help="The task; omitted: the env type and every task of it.")] = None,
        farm: FarmUrl = "http://127.0.0.1:8000", key: KeyOpt = None) -> None:
    """Put a task (or an env type) back into rotation."""
    async def go() -> list[Any]:
        async with Farm(farm, api_key=key) as client:
            return await client.lift_quarantine(env, task)

    lifted = _run(go())
    console.print(f"lifted {len(lifted)}" + (":" if lifted else " (nothing was quarantined there)"))
    if lifted:
        _table(lifted)
