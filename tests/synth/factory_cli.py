"""``python -m tests.synth.factory_cli queries ...``: ``synth``'s command line with the trainer's agent
loop registered (what ``envfarm synth`` does), for tests that run it in a subprocess."""

from synth.cli import app
from synth.factory.gate import register_agent_loop
from tests.fakes.factory_agent import trainer_agent_loop

if __name__ == "__main__":
    register_agent_loop(trainer_agent_loop)
    app()
