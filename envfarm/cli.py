"""The `envfarm` command line: one root app; each concern registers its own sub-commands."""

from __future__ import annotations

import typer

from envfarm import cli_envs, cli_farm
from judge.cli import judge_command
from synth.cli import app as synth_app
from trainer.cli import register as register_trainer
from trainer.sft import register as register_sft_format

app = typer.Typer(help="envfarm: synthesize, serve and verify tool-use environments for RL.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(cli_envs.app, name="envs")
cli_farm.register(app)
app.add_typer(synth_app, name="synth")
app.command("judge")(judge_command)
register_trainer(app)
register_sft_format()  # `envfarm synth export` writes the trainer's Qwen3 format too


if __name__ == "__main__":
    app()
