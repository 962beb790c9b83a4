"""The `envfarm` command line: one root app; each concern registers its own sub-commands."""

from __future__ import annotations

import typer

from cluster import cli_envs, cli_farm
from cluster.cli_train import register as register_trainer
from judge.cli import judge_command
from synth.cli import app as synth_app
from synth.factory.gate import AgentSolver, register_agent_loop
from trainer.episode import EpisodeConfig, run_episode
from trainer.policy import OpenAIPolicy
from trainer.sft import register as register_sft_format

app = typer.Typer(help="envfarm: synthesize, serve and verify tool-use environments for RL.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(cli_envs.app, name="envs")
cli_farm.register(app)
app.add_typer(synth_app, name="synth")
app.command("judge")(judge_command)
register_trainer(app)
register_sft_format()  # `envfarm synth export` writes the trainer's Qwen3 format too
# `envfarm synth queries`' gate: an agent (the trainer's loop) must solve each written request.
register_agent_loop(lambda ep: AgentSolver(
    run_episode, OpenAIPolicy(ep.base_url, ep.model, api_key=ep.api_key),
    EpisodeConfig(max_turns=ep.max_turns, window=None)))


if __name__ == "__main__":
    app()
