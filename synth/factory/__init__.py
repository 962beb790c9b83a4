"""EnvFactory's half of synth: tool dependency graph, chain sampling, QueryGen, export.

The stages talk through the pydantic models in ``synth.factory.model`` and the files they name.
"""
