"""Hostile JSON bodies get a typed 400 before any route, framework or env code parses them.

What the frameworks and generated code handle badly, each answered ``MalformedJSON`` (400) on
every route, HTTP and MCP, with the connection kept: nesting deeper than ``MAX_DEPTH`` (3,000
levels took the C parser to a RecursionError, a 500 and a dropped connection), integers beyond
SQLite's 64 bits, non-finite numbers (``NaN``, ``Infinity``, ``1e999``), duplicate object keys
(which one counts differs between parsers), bytes that are not UTF-8 and lone surrogates
(``"\\ud800"``: any later encode raises). Bodies that are merely not JSON, or not the schema,
go on to the route, which answers them its own way (422 / JSON-RPC parse error).
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from envfarm.errors import MalformedJSON
from envfarm.farm._fastpath import read_body, replay
from envfarm.farm._http import error_response

MAX_DEPTH = 64
_INT64 = 2**63


class _Hostile(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Hostile(f"duplicate key {dup[:50]!r} in an object")
    return out


def _int(text: str) -> int:
    if len(text) > 20:  # int() of thousands of digits is slow, and over 4,300 it refuses
        raise _Hostile("an integer beyond 64 bits")
    value = int(text)
    if not -_INT64 <= value < _INT64:
        raise _Hostile("an integer beyond 64 bits")
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Hostile(f"a number out of range ({text[:30]})")
    return value


def _constant(name: str) -> Any:
    raise _Hostile(f"{name} is not JSON")


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_int=_int, parse_float=_float,
                            parse_constant=_constant)


def hostile(body: bytes) -> str | None:
    """Why the body is hostile JSON, or None (valid JSON, or not JSON at all: the route says)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body is not UTF-8 (byte {exc.start})"
    try:
        value = _DECODER.decode(text)
    except _Hostile as exc:
        return str(exc)
    except RecursionError:
        return f"nesting deeper than {MAX_DEPTH} levels"
    except ValueError:
        return None  # plain syntax errors: each route answers them in its own protocol
    return _walk(value)


def _walk(value: Any) -> str | None:
    """Depth and strings, without recursion (the value may be deep)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return "a string with a lone surrogate (\\ud800-\\udfff) is not valid text"
        elif isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                return f"nesting deeper than {MAX_DEPTH} levels"
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return None


class JSONGuard:
    """ASGI middleware: reads a request body, answers hostile JSON 400, replays the rest."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH", "DELETE"):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the client is gone
        why = hostile(body) if body else None
        if why is not None:
            await error_response(MalformedJSON(f"malformed JSON body: {why}"))(
                scope, receive, send)
            return
        await self.app(scope, replay(body, receive), send)
