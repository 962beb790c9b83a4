"""``envfarm judge TRAJECTORIES.jsonl``: judge recorded episodes offline.

Each input line is a :class:`judge.JudgeRequest` (database paths relative to the file's folder
are allowed); each output line is a :class:`judge.JudgeResponse`, in input order. The lead mounts
:func:`judge_command` on the root typer app: ``app.command("judge")(judge_command)``.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from envfarm.verdict import Outcome, Verdict
from judge.core import Judge, JudgeConfig, JudgeRequest, JudgeResponse
from judge.sandbox import SandboxConfig


def _load(path: Path) -> list[JudgeRequest | str]:
    """Requests, or the reason a line is unusable (kept, so output lines match input lines)."""
    items: list[JudgeRequest | str] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            req = JudgeRequest.model_validate_json(line)
        except ValidationError as exc:
            items.append(f"line {n}: {exc.errors()[0]['msg']}")
            continue
        updates = {}
        for field in ("initial_db", "final_db"):
            value = getattr(req, field)
            if value and not Path(value).is_absolute():
                updates[field] = str(path.parent / value)
        items.append(req.model_copy(update=updates) if updates else req)
    return items


async def judge_file(path: Path, out: Path, judge: Judge, concurrency: int = 256,
                     console: Console | None = None) -> Counter[str]:
    """Judge every line of ``path`` into ``out``; returns a count per outcome."""
    items = _load(path)
    results: list[JudgeResponse | None] = [None] * len(items)
    sem = asyncio.Semaphore(concurrency)
    progress = Progress(TextColumn("judging"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=False)

    async def one(i: int, item: JudgeRequest | str, task_id: int) -> None:
        if isinstance(item, str):
            verdict = Verdict.of(Outcome.invalid, f"judge_error: unreadable request ({item})",
                                 error_kind="judge_error")
            results[i] = JudgeResponse(id=None, verdict=verdict)
        else:
            async with sem:
                verdict = (await judge.judge_many([item]))[0]
            results[i] = JudgeResponse(id=item.id, verdict=verdict)
        progress.advance(task_id)

    with progress:
        task_id = progress.add_task("judge", total=len(items))
        await asyncio.gather(*(one(i, item, task_id) for i, item in enumerate(items)))
    with out.open("w") as fh:
        for res in results:
            fh.write(res.model_dump_json() + "\n")  # type: ignore[union-attr]
    return Counter(r.verdict.outcome.value for r in results if r is not None)


def judge_command(
    trajectories: Annotated[Path, typer.Argument(exists=True, dir_okay=False,
                                                 help="JSONL of judge requests")],
    out: Annotated[Path | None, typer.Option(help="where verdicts go "
                                                  "(default: <input>.verdicts.jsonl)")] = None,
    use_llm: Annotated[str, typer.Option(help="auto | always | never")] = "auto",
    llm_base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL")] = None,
    llm_model: Annotated[str | None, typer.Option(help="judge model name")] = None,
    workers: Annotated[int, typer.Option(help="verifier sandbox processes")] = 2,
    timeout_s: Annotated[float, typer.Option(help="verifier wall-clock limit")] = 10.0,
    concurrency: Annotated[int, typer.Option(help="episodes in flight")] = 256,
) -> None:
    """Judge a file of recorded episodes: verdicts and rewards, one JSON line each."""
    console = Console(stderr=True)
    if use_llm not in ("auto", "always", "never"):
        raise typer.BadParameter("--use-llm must be auto, always or never")
    config = JudgeConfig(use_llm=use_llm,  # type: ignore[arg-type]
                         sandbox=SandboxConfig(workers=workers, timeout_s=timeout_s))
    target = out or trajectories.with_suffix(".verdicts.jsonl")

    async def run() -> Counter[str]:
        judge = Judge.from_env(config, base_url=llm_base_url, model=llm_model)
        async with judge:
            console.print(f"judge mode: {judge.mode}")
            return await judge_file(trajectories, target, judge, concurrency, console)

    counts = asyncio.run(run())
    lines = [f"{k}: {v}" for k, v in sorted(counts.items())]
    console.print(f"wrote {sum(counts.values())} verdicts to {target} ({', '.join(lines)})")
    typer.echo(json.dumps({"out": str(target), "outcomes": dict(counts)}))
