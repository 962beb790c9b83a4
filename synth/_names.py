"""Scenario names, AWM's way."""

from __future__ import annotations

import re


def normalize_name(name: str) -> str:
    """Lower case; runs of characters outside ``[a-z0-9_]`` become one ``_`` (as envfarm's catalog)."""
    return re.sub(r"[^a-z0-9_]+", "_", name.strip().lower()).strip("_")
