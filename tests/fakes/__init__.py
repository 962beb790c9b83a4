"""Doubles shared by the test suite and the benchmarks: fake servers (real HTTP on 127.0.0.1,
scripted answers), scripted LLMs and agents, a toy env and generated catalogs.

The one place both import: ``benchmarks`` may import ``tests.fakes`` and nothing else of
``tests``; ``tests.fakes`` imports nothing else of ``tests``; nothing in ``tests`` imports
``benchmarks`` (``tests/test_layers.py`` checks all three)."""
