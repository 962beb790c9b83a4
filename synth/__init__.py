"""AWM synthesis pipeline: scenarios -> tasks -> db -> sample -> spec -> env -> verifier, self-correcting.

Public entry points: ``synth.pipeline`` (stages) and ``synth.cli`` (typer app); the LLM client
they use is ``envfarm.llm``, shared with the judge.
"""
