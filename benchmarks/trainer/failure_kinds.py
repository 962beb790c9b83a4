"""Why held-out episodes of ``envfarm learn`` runs fail: each format error sorted by what its last
message did wrong, after SFT and after GRPO, greedy and sampled.

    python benchmarks/trainer/failure_kinds.py runs/learn_decay_s3 [RUN ...] [--out FILE]

Kinds, read from the failing turn (the evaluation's ``last``, its last 300 characters) against
the env's tool schemas: ``no_call_block`` (no complete ``<tool_call>`` block: tags garbled or
left open, a value repeated until the generation was cut), ``bad_json`` (a block that is not JSON), ``unknown_tool``,
``unknown_arg`` (a tool that does not take the arguments written: mostly the wrong tool for the
step), ``missing_arg``, ``other`` (another function, a schema type error).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envfarm import EnvRuntime, load_catalog

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
FILES = ("eval_sft_greedy", "eval_grpo_greedy", "eval_sft_sampled", "eval_grpo_sampled")


def kind(row: dict[str, Any], schemas: dict[str, dict[str, dict]]) -> str:
    block = _CALL.search(row["last"])
    if block is None:
        return "no_call_block"
    try:
        call = json.loads(block.group(1))
    except ValueError:
        return "bad_json"
    inner = call.get("arguments") if isinstance(call, dict) else None
    if not isinstance(inner, dict) or call.get("name") != "call_tool":
        return "other"
    schema = schemas[row["env"]].get(inner.get("tool_name"))
    args = inner.get("arguments", {})
    if schema is None:
        return "unknown_tool"
    if not isinstance(args, dict):
        return "other"
    if set(args) - set(schema.get("properties", {})):
        return "unknown_arg"
    if set(schema.get("required", [])) - set(args):
        return "missing_arg"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    opts = ap.parse_args()
    catalog = load_catalog()
    schemas: dict[str, dict[str, dict]] = {}
    report: dict[str, Any] = {}
    for run in opts.runs:
        for name in FILES:
            rows = [json.loads(line) for line in (run / f"{name}.jsonl").read_text().splitlines()]
            held = [r for r in rows if r["split"] != "train"]
            for env in {r["env"] for r in held} - set(schemas):
                schemas[env] = {t.name: t.input_schema for t in EnvRuntime(catalog[env]).tools}
            errors = Counter(kind(r, schemas) for r in held if r["outcome"] == "format_error")
            report[f"{run.name}/{name}"] = {
                "heldout": len(held), "completed": sum(r["outcome"] == "completed" for r in held),
                "format_errors": dict(errors.most_common())}
            print(f"{run.name:24} {name:18}", json.dumps(report[f"{run.name}/{name}"]))
    if opts.out:
        opts.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
