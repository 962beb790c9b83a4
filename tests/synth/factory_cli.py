"""``synth``'s command line with the trainer's agent loop and SFT format handed in (what ``envfarm
synth`` does), the loop being ``tests.fakes.factory_agent.trainer_agent_loop``; ``python -m
tests.synth.factory_cli queries ...`` runs it in a subprocess."""

from synth.cli import make_app
from tests.fakes.factory_agent import trainer_agent_loop
from trainer import sft

app = make_app(agent_loop=trainer_agent_loop, sft_formats=sft.FORMATS)

if __name__ == "__main__":
    app()
