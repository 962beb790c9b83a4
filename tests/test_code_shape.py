"""The library stays readable: no function or method over 80 lines (the tests and benchmarks
are not held to it). Read from the source, so a long function fails here, not in review."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("envfarm", "judge", "synth", "trainer", "cluster")
LIMIT = 80


def long_functions(source: str, name: str = "<src>") -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = node.end_lineno - first + 1
            if length > LIMIT:
                found.append(f"{name}:{node.lineno} {node.name} is {length} lines")
    return found


def test_no_library_function_is_over_80_lines():
    found = []
    for package in LIBRARY:
        for path in sorted((REPO / package).rglob("*.py")):
            found += long_functions(path.read_text(), str(path.relative_to(REPO)))
    assert not found, "split these functions:\n" + "\n".join(found)


def test_the_check_catches_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    assert long_functions(f"def f():\n{body}\n")          # 81 lines
    assert not long_functions(f"def f():\n{body[:body.rfind(chr(10))]}\n")  # 80 lines
    nested = "class C:\n    async def m(self):\n" + "\n".join(f"        y{i} = 0" for i in range(LIMIT))
    assert long_functions(nested) == ["<src>:2 m is 81 lines"]
