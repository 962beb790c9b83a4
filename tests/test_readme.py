"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README should show the runtime in Python"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        code = block.replace('"/tmp/ep1"', repr(str(tmp_path / "ep1")))
        namespace: dict = {}
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own docs
        if "res" in namespace:
            assert namespace["res"].ok, namespace["res"].error
