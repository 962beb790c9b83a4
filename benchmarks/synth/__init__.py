"""Synthesis: the AWM pipeline against a mock LLM, EnvFactory's tool graph, chain sampling and QueryGen."""
