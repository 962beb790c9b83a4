"""``synth export``: accepted episodes as catalog tasks the farm can lease, and as SFT JSONL.

(a) ``<out>/factory_catalog/<env>/``: the env's AWM records copied unchanged, then appended: a
``gen_tasks.jsonl`` record with the env's tasks plus one task per accepted episode (the loader
keeps an env's last tasks record), its code-mode verifier (``gen_verifier.pure_code.jsonl``) and
its reference solution with the final answer (``gen_solutions.jsonl``); ``factory_tasks.jsonl``
maps each new task index to its chain. ``envfarm serve --catalog`` serves the folder as it is.

(b) ``<out>/factory_sft/<format>.jsonl``, one conversation per accepted episode: ``openai``
(``messages`` with ``tool_calls`` + ``tools``) always, and every format registered in
``SFT_FORMATS`` (the trainer registers its Qwen3 text format: synth cannot import the trainer).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envfarm.catalog import AWM_FILES, normalize_name
from envfarm.models import ToolSpec
from synth._jsonl import read_jsonl
from synth._probe import load_runtime
from synth.factory.graph import factory_dir
from synth.factory.model import Episode, task_text
from synth.factory.queries import EPISODES_FILE, valid_records
from synth.factory.run import catalog_envs

CATALOG_DIR = "factory_catalog"
SFT_DIR = "factory_sft"
MAP_FILE = "factory_tasks.jsonl"

#: format name -> (episode, task text, the env's tools) -> one JSONL record
SftFormat = Callable[[Episode, str, list[ToolSpec]], dict[str, Any]]
SFT_FORMATS: dict[str, SftFormat] = {}


def turns(episode: Episode) -> list[tuple[str, list[int]]]:
    """Each user message with the calls that answer it: the calls are shared out in order, the
    first message getting the first share (a follow-up asks for what comes next)."""
    n, k = len(episode.calls), max(1, len(episode.messages))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [(msg, list(range(bounds[i], bounds[i + 1]))) for i, msg in enumerate(episode.messages)]


def openai_record(episode: Episode, task: str, tools: list[ToolSpec]) -> dict[str, Any]:
    """OpenAI chat format: ``messages`` with assistant ``tool_calls`` and ``tool`` answers, plus ``tools``."""
    messages: list[dict[str, Any]] = []

    def say(role: str, content: str, tool_calls: Any = None, tool_call_id: Any = None) -> None:
        # every message has every key: datasets reads a list of structs with one schema
        messages.append({"role": role, "content": content, "tool_calls": tool_calls, "tool_call_id": tool_call_id})

    for msg, idx in turns(episode):
        say("user", msg)
        for i in idx:
            call, cid = episode.calls[i], f"call_{i}"
            say("assistant", "", [{"id": cid, "type": "function",
                                   "function": {"name": call.tool, "arguments": json.dumps(call.arguments)}}])
            say("tool", json.dumps(call.result, default=str), tool_call_id=cid)
        if idx and idx[-1] != len(episode.calls) - 1:
            say("assistant", "Done. What next?")
    say("assistant", episode.final_answer or "Done.")
    used = {c.tool for c in episode.calls}
    return {"env": episode.env, "chain_id": episode.chain_id, "messages": messages,
            # the whole tool list as a JSON string: tools of different envs differ in shape,
            # which a datasets column of structs cannot hold
            "tools": json.dumps([{"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.input_schema}}
                for t in tools if t.name in used or len(tools) <= 64])}


def _env_records(root: Path, env: str) -> dict[str, list[str]]:
    """The env's raw lines of each AWM file, from the catalog folder and its subfolders."""
    folders = [root] + sorted(p for p in root.iterdir() if p.is_dir())
    out: dict[str, list[str]] = {}
    for folder in folders:
        for name in AWM_FILES:
            path = folder / name
            if not path.is_file():
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                scenario = rec.get("scenario", rec.get("name")) if isinstance(rec, dict) else None
                if isinstance(scenario, str) and normalize_name(scenario) == env:
                    out.setdefault(name, []).append(line)
    return out


def _write(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)


def export_env(catalog: Any, name: str, out: Path, episodes: list[Episode]) -> dict[str, Any]:
    """Write the env's catalog folder with the accepted episodes appended as tasks."""
    bundle = catalog[name]
    folder = Path(out) / CATALOG_DIR / name
    folder.mkdir(parents=True, exist_ok=True)
    records = _env_records(catalog.root, name)
    first = len(bundle.tasks)
    tasks = [*bundle.tasks, *(task_text(e) for e in episodes)]
    records.setdefault("gen_tasks.jsonl", []).append(json.dumps({"scenario": name, "tasks": tasks}))
    for i, e in enumerate(episodes):
        idx = first + i
        records.setdefault("gen_verifier.pure_code.jsonl", []).append(json.dumps({
            "scenario": name, "task_idx": idx, "task": task_text(e),
            "verification": {"code": e.verifier_code, "raw_response": ""}}))
        records.setdefault("gen_solutions.jsonl", []).append(json.dumps({
            "scenario": name, "task_idx": idx, "final_answer": e.final_answer,
            "solution": [{"tool": c.tool, "arguments": c.arguments} for c in e.calls]}))
    for file_name, lines in records.items():
        _write(folder / file_name, lines)
    _write(folder / MAP_FILE, [json.dumps({"task_idx": first + i, "chain_id": e.chain_id, "messages": e.messages})
                               for i, e in enumerate(episodes)])
    return {"folder": str(folder), "first_task": first, "tasks": len(episodes)}


def export_catalog(catalog_path: Path | None, out: Path, *, envs: list[str] | None = None,
                   tool_timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Export every env's accepted episodes; one summary row per env."""
    catalog, names = catalog_envs(catalog_path, envs)
    formats: dict[str, SftFormat] = {"openai": openai_record, **SFT_FORMATS}
    sft: dict[str, list[str]] = {f: [] for f in formats}
    rows = []
    for name in names:
        episodes, _ = valid_records(read_jsonl(factory_dir(out, name) / EPISODES_FILE), Episode)
        accepted = [e for e in episodes if e.accepted]
        if not accepted:
            rows.append({"env": name, "error": "no accepted episodes: run `envfarm synth queries` first"})
            continue
        runtime, why = load_runtime(catalog[name], tool_timeout_s)
        if runtime is None:
            rows.append({"env": name, "error": why})
            continue
        row = {"env": name, **export_env(catalog, name, out, accepted)}
        for fmt, make in formats.items():
            sft[fmt] += [json.dumps(make(e, task_text(e), runtime.tools), default=str) for e in accepted]
        rows.append(row)
    if any(sft.values()):
        (Path(out) / SFT_DIR).mkdir(parents=True, exist_ok=True)
        for fmt, lines in sft.items():
            _write(Path(out) / SFT_DIR / f"{fmt}.jsonl", lines)
    return rows


def format_export_row(row: dict[str, Any]) -> str:
    return (f"{row['env']}: {row['tasks']} tasks appended as tasks {row['first_task']}.."
            f"{row['first_task'] + row['tasks'] - 1} in {row['folder']}")
