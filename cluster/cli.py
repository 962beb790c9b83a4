"""The `envfarm` command line: one root app; each concern registers its own sub-commands, and
what one package needs of another is handed in here (synth gets the trainer's agent loop and
SFT format as arguments)."""

from __future__ import annotations

import typer

from cluster import cli_envs, cli_farm
from cluster.cli_train import register as register_trainer
from judge.cli import judge_command
from synth.cli import make_app as synth_app
from synth.factory.gate import AgentEndpoint, AgentSolver
from trainer import sft
from trainer.episode import EpisodeConfig, run_episode
from trainer.policy import OpenAIPolicy


def trainer_agent(endpoint: AgentEndpoint) -> AgentSolver:
    """`envfarm synth queries`' gate: the trainer's agent loop on an OpenAI-compatible endpoint
    must solve each written request."""
    return AgentSolver(run_episode, OpenAIPolicy(endpoint.base_url, endpoint.model,
                                                 api_key=endpoint.api_key),
                       EpisodeConfig(max_turns=endpoint.max_turns, window=None))


app = typer.Typer(help="envfarm: synthesize, serve and verify tool-use environments for RL.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(cli_envs.app, name="envs")
cli_farm.register(app)
app.add_typer(synth_app(agent_loop=trainer_agent, sft_formats=sft.FORMATS), name="synth")
app.command("judge")(judge_command)
register_trainer(app)


if __name__ == "__main__":
    app()
