"""AWM synthesis pipeline: scenarios -> tasks -> db -> sample -> spec -> env -> verifier, self-correcting.

Kept light on purpose: ``synth.llm`` is imported by the judge, so nothing heavy loads here.
Public entry points: ``synth.llm`` (LLM client), ``synth.pipeline`` (stages), ``synth.cli`` (typer app).
"""
