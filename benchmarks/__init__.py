"""Reproducible performance runs, one folder per area; figures in ``benchmarks/RESULTS.md``,
raw numbers in ``benchmarks/results/``. Helpers shared across areas: ``_procs.py``; doubles
shared with the test suite: ``tests/fakes/``."""
