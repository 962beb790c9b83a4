"""`envfarm train` and `envfarm rollout`. Mount with ``register(app)``.

Heavy imports (torch, transformers, Ray) happen inside the commands that need them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console(soft_wrap=True)

FarmOpt = Annotated[str | None, typer.Option(
    "--farm", help="URL of a running farm; default: start an embedded --no-ray farm.")]
FarmKeyOpt = Annotated[str | None, typer.Option(
    "--farm-key", envvar="ENVFARM_API_KEY", show_default=False,
    help="The farm API key of your tenant (env ENVFARM_API_KEY), for a shared farm.")]


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("rollout")(rollout)
    app.command("learn")(learn)


@contextmanager
def farm_url(url: str | None, catalog: str | None, envs: list[str] | None,
             warm: int = 8) -> Iterator[str]:
    """The given farm, or an embedded one on 127.0.0.1 for as long as the command runs."""
    if url:
        yield url
        return
    from cluster.compose import LocalFarm
    from envfarm.farm import FarmConfig, PoolConfig

    config = FarmConfig(catalog=catalog, envs=envs, pool=PoolConfig(warm=warm))
    with LocalFarm(config) as farm:
        yield farm.url


def train(config: Annotated[Path, typer.Option("--config", exists=True, dir_okay=False,
                                               help="train.yaml (see trainer/configs/)")],
          farm: FarmOpt = None, farm_key: FarmKeyOpt = None,
          no_ray: Annotated[bool, typer.Option(
              "--no-ray", help="Train in this process instead of a Ray TrainerActor.")] = False,
          steps: Annotated[int | None, typer.Option("--steps", help="Override steps.")] = None,
          out_dir: Annotated[Path | None, typer.Option("--out-dir",
                                                       help="Override out_dir.")] = None,
          ) -> None:
    """History-windowed GRPO against the farm; resumes from the last checkpoint in out_dir."""
    from trainer.config import TrainConfig

    if farm_key:
        # The SDK reads it there, in this process and in the Ray trainer actor it starts.
        os.environ["ENVFARM_API_KEY"] = farm_key
    cfg = TrainConfig.from_yaml(config, steps=steps,
                                out_dir=str(out_dir) if out_dir else None)
    warm = min(64, cfg.batch_size * cfg.group_size)
    with farm_url(farm, cfg.catalog, cfg.envs, warm=warm) as url:
        if no_ray:
            from trainer.train import train as run

            asyncio.run(run(cfg, url, log=console.print))
        else:
            from trainer.actor import train_on_ray

            train_on_ray(cfg, url, log=console.print)
    console.print(f"metrics: {Path(cfg.out_dir) / 'metrics.jsonl'}  plot: "
                  f"{Path(cfg.out_dir) / 'plot.png'}  checkpoints: "
                  f"{Path(cfg.out_dir) / 'checkpoints'}")


def learn(config: Annotated[Path, typer.Option("--config", exists=True, dir_okay=False,
                                               help="learn.yaml (see trainer/configs/)")],
          farm: FarmOpt = None,
          seed: Annotated[int | None, typer.Option("--seed", help="Override seed.")] = None,
          out_dir: Annotated[Path | None, typer.Option("--out-dir",
                                                       help="Override out_dir.")] = None,
          threads: Annotated[int | None, typer.Option("--threads", help="Override threads (torch "
                                                      "threads; 1 per seed when seeds share cores).")] = None,
          start_from: Annotated[Path | None, typer.Option(
              "--start-from", exists=True, file_okay=False,
              help="A saved SFT model (a learn run's model_sft): GRPO from it, no warm-up or SFT.")] = None,
          grpo_steps: Annotated[int | None, typer.Option(
              "--grpo-steps", min=1, help="Override grpo.steps (the total, counting resumed steps).")] = None,
          resume: Annotated[bool, typer.Option(
              "--resume", help="Continue --out-dir's GRPO from its last checkpoint up to the GRPO "
                               "steps (optimizer and step restored; earlier evaluations kept).")] = False,
          ) -> None:
    """SFT to partial competence, then pure GRPO, on a task suite built from the bundled envs;
    the model's own success (greedy and sampled) on train and held-out tasks at each stage."""
    from trainer.learn import LearnConfig, prepare, run

    cfg = LearnConfig.from_yaml(config, seed=seed, out_dir=str(out_dir) if out_dir else None,
                                threads=threads, start_from=str(start_from) if start_from else None,
                                resume=resume or None)
    if grpo_steps is not None:
        cfg.grpo["steps"] = grpo_steps
    suite = prepare(cfg, log=console.print)
    with farm_url(farm, str(suite.catalog), suite.envs, warm=16) as url:
        report = run(cfg, url, suite, log=console.print)
    table = Table("stage", "mode", *(f"{split} success" for split in ("train", "heldout_values",
                                                                      "heldout_chains")),
                  "train format errors")
    for stage, modes in report["evals"].items():
        for mode, ev in modes.items():
            table.add_row(stage, mode, *(_rate(ev.get(k, {}).get("success_rate"))
                                         for k in ("train", "heldout_values", "heldout_chains")),
                          _rate(ev["train"]["format_error_rate"]))
    console.print(table)
    console.print(f"{report['seconds']['total']:.0f} s wall, {report['cpu_seconds']['total']:.0f} s CPU; "
                  f"report: {Path(cfg.out_dir) / 'learn.json'}  plot: {Path(cfg.out_dir) / 'learn.png'}")


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def rollout(
    base_url: Annotated[str | None, typer.Option(
        "--base-url", help="OpenAI-compatible endpoint (vLLM, SGLang, OpenAI) .../v1")] = None,
    model: Annotated[str, typer.Option("--model", help="Model name at the endpoint.")] = "",
    api_key: Annotated[str, typer.Option("--api-key", envvar="OPENAI_API_KEY",
                                         help="API key (env OPENAI_API_KEY).")] = "EMPTY",
    scripted: Annotated[bool, typer.Option(
        "--scripted", help="Replay reference solutions instead (no model).")] = False,
    hf_model: Annotated[Path | None, typer.Option(
        "--hf-model", help="A local HF checkpoint folder, run in this process (CPU).")] = None,
    farm: FarmOpt = None, farm_key: FarmKeyOpt = None,
    catalog: Annotated[Path | None, typer.Option("--catalog", help="Catalog folder.")] = None,
    envs: Annotated[str | None, typer.Option("--envs", help="Comma-separated envs.")] = None,
    tasks: Annotated[str | None, typer.Option("--tasks",
                                              help="Comma-separated task indices.")] = None,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Episodes per task.")] = 1,
    out: Annotated[Path, typer.Option("--out", help="Trajectories + rewards JSONL.")] = Path(
        "rollouts.jsonl"),
    concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 16,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1)] = 20,
    window: Annotated[int, typer.Option("--window", min=0, help="History window w.")] = 3,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 1024,
    temperature: Annotated[float, typer.Option("--temperature", min=0)] = 0.7,
    tool_listing: Annotated[str, typer.Option(
        "--tool-listing", help="full, compact (short list_tools answers: small models) or names")
    ] = "full",
    max_tool_chars: Annotated[int, typer.Option("--max-tool-chars", min=100)] = 8000,
) -> None:
    """Run the agent loop only (no training) and report success per env and overall."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from envfarm import load_catalog
    from envfarm.client import Farm
    from trainer.episode import EpisodeConfig
    from trainer.policy import OpenAIPolicy
    from trainer.rollout import run_rollouts

    cat = load_catalog(catalog)
    names = [e.strip() for e in envs.split(",") if e.strip()] if envs else cat.servable
    wanted = {int(t) for t in tasks.split(",")} if tasks else None
    jobs = [(cat[n].name, idx) for n in names for idx in sorted(cat[n].code_verifiers)
            if wanted is None or idx in wanted] * repeat
    if not jobs:
        raise typer.BadParameter("no task with a code-mode verifier among the chosen envs/tasks")
    policy = _policy(cat, scripted=scripted, hf_model=hf_model, base_url=base_url, model=model,
                     api_key=api_key, temperature=temperature, max_tokens=max_tokens)
    if tool_listing not in ("full", "compact", "names"):
        raise typer.BadParameter("--tool-listing is full, compact or names")
    config = EpisodeConfig(max_turns=max_turns, window=window, tool_listing=tool_listing,
                           max_tool_chars=max_tool_chars)

    async def go(url: str):
        async with Farm(url, api_key=farm_key) as client:
            with Progress("[progress.description]{task.description}", BarColumn(),
                          MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
                task = bar.add_task("episodes", total=len(jobs))
                try:
                    return await run_rollouts(client, policy, jobs, concurrency=concurrency,
                                              config=config, out=out,
                                              on_done=lambda _: bar.advance(task))
                finally:
                    if isinstance(policy, OpenAIPolicy):
                        await policy.aclose()

    with farm_url(farm, str(catalog) if catalog else None, [cat[n].name for n in names],
                  warm=min(64, concurrency)) as url:
        results = asyncio.run(go(url))
    _print_scores(results)
    console.print(f"trajectories + rewards: {out}")


def _policy(cat, *, scripted: bool, hf_model: Path | None, base_url: str | None, model: str,
            api_key: str, temperature: float, max_tokens: int):
    """The policy ``envfarm rollout``'s options name: replayed references, a local HF
    checkpoint, or an OpenAI-compatible endpoint."""
    from trainer.policy import OpenAIPolicy, ScriptedPolicy

    if scripted:
        return ScriptedPolicy.from_catalog(cat)
    if hf_model:
        from trainer.hf import HFPolicy

        return HFPolicy.from_path(hf_model, max_new_tokens=max_tokens, temperature=temperature)
    if base_url and model:
        return OpenAIPolicy(base_url, model, api_key=api_key, temperature=temperature,
                            max_tokens=max_tokens)
    raise typer.BadParameter("give --base-url and --model, --hf-model, or --scripted")


def _print_scores(results) -> None:
    from trainer.rollout import scores

    table = Table("env", "episodes", "valid", "success rate", "mean reward", "format errors")
    for name, s in sorted(scores(results).items(), key=lambda kv: kv[0] == "overall"):
        table.add_row(name, str(s.episodes), str(s.valid),
                      "-" if s.success_rate is None else f"{s.success_rate:.1%}",
                      "-" if s.reward_mean is None else f"{s.reward_mean:.3f}",
                      str(s.format_errors))
    console.print(table)
