"""Pull JSON objects and code blocks out of LLM text (fences, chatter and all)."""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```([a-zA-Z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


class ParseError(ValueError):
    """The LLM answer does not contain what the stage asked for."""


def extract_json(text: str) -> dict[str, Any]:
    """The first JSON object in ``text``: a fenced block, the whole text, or the outermost braces."""
    candidates = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("", "json")]
    candidates.append(text)
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    last_error = "no JSON object found"
    for cand in candidates:
        try:
            value = json.loads(cand.strip())
        except json.JSONDecodeError as exc:
            last_error = f"invalid JSON: {exc}"
            continue
        if isinstance(value, dict):
            return value
        last_error = f"expected a JSON object, got {type(value).__name__}"
    raise ParseError(last_error)


def extract_list(text: str, key: str) -> list[Any]:
    """The non-empty list under ``key`` of the JSON object in ``text``; ParseError otherwise."""
    value = extract_json(text).get(key)
    if not isinstance(value, list) or not value:
        raise ParseError(f'"{key}" must be a non-empty list')
    return value


def extract_code(text: str) -> str:
    """The longest fenced python block, or the whole text when there is no fence."""
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("", "python", "py")]
    if blocks:
        return max(blocks, key=len).strip() + "\n"
    if "```" in text:
        raise ParseError("unterminated code fence")
    return text.strip() + "\n"
