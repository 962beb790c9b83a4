"""Guard a catalog's code-mode verifiers against collateral writes.

Hand- or LLM-written verifiers check what the task asks for and nothing else, so an episode that
also deletes or changes rows the task never touches still passes (the hack probes' side_effect).
``guard_code`` wraps such a verifier: when it says ``complete``, every row the reference solution
did not touch must be as it was (no row of another table added, changed or deleted; in the
tables the reference writes, rows it did not touch unchanged and new rows allowed). Tables the
env's read tools write (a log) are left out. ``envfarm synth guard CATALOG --write`` guards every
task that has a reference solution, in place (the bundled catalog's were made so).
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

from envfarm.catalog import Catalog
from envfarm.dbrows import changed_rows
from envfarm.runtime import EnvRuntime
from envfarm.check import probe_arguments
from synth.factory.verifier import READER, reader_source

CODE_FUNCTION = "verify_task_completion"
GUARDED = "_verify_unguarded"

_WRAPPER = '''

def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    """The task's own check, then: nothing the task does not touch was changed."""
    GUARD = {guard!r}
    result = {inner}(initial_db_path, final_db_path, final_answer)
    if not isinstance(result, dict) or str(result.get("result", "")).strip().lower() != "complete":
        return result

    before, after = {reader}(initial_db_path), {reader}(final_db_path)
    for table in sorted(set(before) | set(after)):
        if table in GUARD["ignore"]:
            continue
        touched = set(GUARD["touched"].get(table, []))
        old, new = before.get(table, {{}}), after.get(table, {{}})
        for rowid, row in old.items():
            if rowid not in touched and new.get(rowid) != row:
                return {{"result": "others", "reason": f"{{table}} row {{rowid}} was changed or deleted, "
                         "which the task does not ask for"}}
        if table not in GUARD["touched"] and any(rowid not in old for rowid in new):
            return {{"result": "others", "reason": f"rows added to {{table}}, which the task does not write"}}
    return result
'''


def guard_code(code: str, touched: dict[str, list[int]], ignore: list[str]) -> str:
    """``code`` with its ``verify_task_completion`` renamed and wrapped (module doc). Code that
    is already guarded, or has no such function, is returned as it is."""
    tree = ast.parse(code)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == CODE_FUNCTION]
    if GUARDED in code or len(defs) != 1:
        return code
    lines = code.splitlines(keepends=True)
    line = defs[0].lineno - 1
    lines[line] = lines[line].replace(f"def {CODE_FUNCTION}(", f"def {GUARDED}(", 1)
    guard = {"touched": {t: sorted(rows) for t, rows in sorted(touched.items())}, "ignore": sorted(ignore)}
    return ("".join(lines).rstrip("\n") + "\n" + _WRAPPER.format(guard=guard, inner=GUARDED, reader=READER)
            + "\n\n" + reader_source())


async def touched_rows(runtime: EnvRuntime, idx: int) -> dict[str, list[int]] | None:
    """table -> rowids the task's reference solution adds, changes or deletes (None: no
    reference, or one of its calls fails)."""
    calls = runtime.bundle.solutions.get(idx)
    return await touched_by(runtime, calls) if calls else None


async def touched_by(runtime: EnvRuntime, calls: list[Any]) -> dict[str, list[int]] | None:
    """table -> rowids ``calls`` (``ToolCall``s, run in order on a fresh instance) add, change or
    delete; None when one of them fails."""
    inst = runtime.instance()
    try:
        for call in calls:
            if not (await inst.call(call.tool, call.arguments)).ok:
                return None
        final = inst.snapshot()
    finally:
        inst.close()
    out: dict[str, list[int]] = {}
    for table, rowid in changed_rows(runtime.template.data, final):
        out.setdefault(table, []).append(rowid)
    return out


async def guard_env(runtime: EnvRuntime, ignore: set[str]) -> dict[int, str]:
    """task -> guarded code, for every task with a code-mode verifier and a working reference."""
    out = {}
    for idx, verifier in sorted(runtime.bundle.code_verifiers.items()):
        touched = await touched_rows(runtime, idx)
        if touched is not None:
            guarded = guard_code(verifier.code, touched, sorted(ignore))
            if guarded != verifier.code:
                out[idx] = guarded
    return out


async def read_written_tables(runtime: EnvRuntime) -> set[str]:
    """Tables the env's read tools (GET) write when called with example arguments: an access log,
    a view counter. Templated verifiers leave them out (an agent's extra reads write them too)."""
    out: set[str] = set()
    data = runtime.template.data
    for tool in runtime.tools:
        if runtime.operations[tool.name].method.upper() not in ("GET", "HEAD"):
            continue
        for args in probe_arguments(tool, None, 2):
            inst = runtime.instance()
            try:
                if (await inst.call(tool.name, args)).ok:
                    out |= {table for table, _ in changed_rows(data, inst.snapshot())}
            finally:
                inst.close()
    return out


def rewrite_verifiers(catalog: Catalog, name: str, guarded: dict[int, str]) -> list[Path]:
    """Replace the guarded tasks' code in every ``gen_verifier.pure_code.jsonl`` that holds
    them (atomically; other records untouched)."""
    root = catalog.root
    written = []
    for path in [root / "gen_verifier.pure_code.jsonl", *sorted(root.glob("*/gen_verifier.pure_code.jsonl"))]:
        if not path.is_file():
            continue
        records: list[Any] = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        changed = False
        for rec in records:
            idx = rec.get("task_idx")
            if catalog[rec["scenario"]].name == name and idx in guarded:
                rec["verification"]["code"] = guarded[idx]
                changed = True
        if changed:
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
            os.replace(tmp, path)
            written.append(path)
    return written
