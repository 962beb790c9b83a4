"""Structured truncation: make a JSON value fit a character budget without losing any key.

Verifier output is a dict whose decisive field can sit anywhere (``"status_matches": false``
between two long row dumps). Cutting the serialized text keeps the head and the tail and loses
the middle; :func:`fit_json` instead shortens *values*: long strings keep their start and say
how much was cut, long lists keep their first and last items and say how many were dropped. Every key of
every object that is kept stays, with its scalar values intact (numbers, booleans, null and
short strings are never touched), so a decisive flag survives any amount of bulk around it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["dumps", "fit_json"]

# From generous to tight; the first pair whose result fits the budget wins.
_STRING_CAPS = (4000, 2000, 1000, 500, 240, 120, 60, 30)
_LIST_CAPS = (50, 30, 20, 10, 6, 4, 3, 2)
_DEPTH = 12


def dumps(value: Any) -> str:
    """The compact, ASCII-only JSON the judge prompt carries."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str)


def fit_json(value: Any, max_chars: int) -> tuple[Any, bool]:
    """``(value that serializes within max_chars where possible, whether anything was cut)``.

    When even the tightest caps do not fit (thousands of keys), the tightest result is returned:
    keys are never dropped to meet the budget.
    """
    if len(dumps(value)) <= max_chars:
        return value, False
    fitted: Any = value
    for s_cap, l_cap in zip(_STRING_CAPS, _LIST_CAPS):
        fitted = _shrink(value, s_cap, l_cap, 0)
        if len(dumps(fitted)) <= max_chars:
            break
    return fitted, True


def _shrink(value: Any, s_cap: int, l_cap: int, depth: int) -> Any:
    if isinstance(value, str):
        if len(value) <= s_cap:
            return value
        return f"{value[:s_cap]}...[{len(value) - s_cap} more chars cut]"
    if isinstance(value, dict):
        if depth >= _DEPTH:
            return _shrink(dumps(value), s_cap, l_cap, depth)
        return {str(k): _shrink(v, s_cap, l_cap, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if depth >= _DEPTH:
            return _shrink(dumps(value), s_cap, l_cap, depth)
        if len(value) <= l_cap:
            return [_shrink(v, s_cap, l_cap, depth + 1) for v in value]
        # the first and the last items: a trajectory's end matters as much as its start
        head, tail = value[:(l_cap + 1) // 2], value[len(value) - l_cap // 2:]
        return ([_shrink(v, s_cap, l_cap, depth + 1) for v in head]
                + [f"...[{len(value) - len(head) - len(tail)} more items cut]"]
                + [_shrink(v, s_cap, l_cap, depth + 1) for v in tail])
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _shrink(str(value), s_cap, l_cap, depth)
