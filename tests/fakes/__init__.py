"""Fake servers used by the test suite (real HTTP on 127.0.0.1, scripted answers)."""
