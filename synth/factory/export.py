"""``synth export``: accepted episodes as catalog tasks the farm can lease, and as SFT JSONL.

(a) ``<out>/factory_catalog/<env>/``: the env's AWM records copied unchanged, then appended: a
``gen_tasks.jsonl`` record with the env's tasks plus one task per accepted episode (the loader
keeps an env's last tasks record), its code-mode verifier (``gen_verifier.pure_code.jsonl``) and
its reference solution with the final answer (``gen_solutions.jsonl``); ``factory_tasks.jsonl``
maps each new task index to its chain. ``envfarm serve --catalog`` serves the folder as it is.

(b) ``<out>/factory_sft/<format>.jsonl``, one conversation per accepted episode: ``openai``
(OpenAI's chat fine-tuning format: ``messages`` with ``tool_calls``, ``tools`` as an array of
functions) always, and every format handed to ``export_catalog`` (the command line hands in the
trainer's Qwen3 text format: synth cannot import the trainer). Exporting some envs replaces their records and
keeps every other env's, so a second export of the same episodes writes the same files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
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
from synth.factory.sql_verifier import sql_raw_response
from synth.factory.verifier import key_value

CATALOG_DIR = "factory_catalog"
SFT_DIR = "factory_sft"
MAP_FILE = "factory_tasks.jsonl"

#: format name -> (episode, task text, the env's tools) -> one JSONL record
SftFormat = Callable[[Episode, str, list[ToolSpec]], dict[str, Any]]


def turns(episode: Episode) -> list[tuple[str, list[int]]]:
    """Each user message with the calls that answer it, as QueryGen planned them; an episode
    without a plan (older files) shares the calls out in order, the first message first."""
    n, k = len(episode.calls), max(1, len(episode.messages))
    sizes = episode.turn_calls
    if len(sizes) != len(episode.messages) or sum(sizes) != n:
        bounds = [round(i * n / k) for i in range(k + 1)]
        sizes = [bounds[i + 1] - bounds[i] for i in range(k)]
    out, start = [], 0
    for msg, size in zip(episode.messages, sizes, strict=True):
        out.append((msg, list(range(start, start + size))))
        start += size
    return out


def turn_reply(episode: Episode, idx: list[int]) -> str:
    """What the assistant says when a turn's calls are done: the episode's answer after the last
    turn; after an earlier one, the value its last call returned that a user asked about, or "Done"."""
    if not idx or idx[-1] == len(episode.calls) - 1:
        return episode.final_answer or "Done."
    call = episode.calls[idx[-1]]
    found = None if call.changed else key_value(call.result)
    if found is None:
        return "Done."
    return f"Done. The {found[0].rsplit('.', 1)[-1].strip('[]').replace('_', ' ')} is {found[1]}."


def openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """The env's tools in OpenAI's ``tools`` shape."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description or t.name,
                                              "parameters": t.input_schema}} for t in tools]


def openai_record(episode: Episode, task: str, tools: list[ToolSpec]) -> dict[str, Any]:
    """OpenAI chat format, drop-in for fine-tuning: ``messages`` (each with only the keys its role
    has) with assistant ``tool_calls`` answered by ``tool`` messages, one user message per
    planned turn, and ``tools`` as OpenAI's array of functions."""
    messages: list[dict[str, Any]] = []
    for msg, idx in turns(episode):
        messages.append({"role": "user", "content": msg})
        for i in idx:
            call, cid = episode.calls[i], f"call_{i}"
            messages.append({"role": "assistant", "tool_calls": [{
                "id": cid, "type": "function",
                "function": {"name": call.tool, "arguments": json.dumps(call.arguments)}}]})
            messages.append({"role": "tool", "tool_call_id": cid, "content": json.dumps(call.result, default=str)})
        messages.append({"role": "assistant", "content": turn_reply(episode, idx)})
    return {"env": episode.env, "chain_id": episode.chain_id, "messages": messages, "tools": openai_tools(tools)}


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
        if e.sql_verifier_code:  # facts for the LLM judge (the llm reward path reads these)
            records.setdefault("gen_verifier.jsonl", []).append(json.dumps({
                "scenario": name, "task_idx": idx, "task": task_text(e),
                "verification": {"code": e.sql_verifier_code, "raw_response": sql_raw_response()}}))
        records.setdefault("gen_solutions.jsonl", []).append(json.dumps({
            "scenario": name, "task_idx": idx, "final_answer": e.final_answer,
            "solution": [{"tool": c.tool, "arguments": c.arguments} for c in e.calls]}))
        if e.task_state:  # the scenario's own starting database (the farm serves the task from it)
            records.setdefault("gen_task_states.jsonl", []).append(json.dumps({
                "scenario": name, "task_idx": idx, "drop_rows": e.task_state}))
    for file_name, lines in records.items():
        _write(folder / file_name, lines)
    # the farm's task is one text; the multi-turn user (each message and the calls it asks for) is here
    _write(folder / MAP_FILE, [json.dumps({"task_idx": first + i, "chain_id": e.chain_id, "messages": e.messages,
                                           "turn_calls": [len(idx) for _, idx in turns(e)]})
                               for i, e in enumerate(episodes)])
    return {"folder": str(folder), "first_task": first, "tasks": len(episodes)}


def export_catalog(catalog_path: Path | None, out: Path, *, envs: list[str] | None = None,
                   tool_timeout_s: float = 10.0, formats: Mapping[str, SftFormat] | None = None
                   ) -> list[dict[str, Any]]:
    """Export every env's accepted episodes; one summary row per env. ``formats``: SFT formats
    besides OpenAI's (the trainer's Qwen3, handed in by the command line)."""
    catalog, names = catalog_envs(catalog_path, envs)
    formats = {"openai": openai_record, **(formats or {})}
    sft: dict[str, list[dict[str, Any]]] = {f: [] for f in formats}
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
            sft[fmt] += [json.loads(json.dumps(make(e, task_text(e), runtime.tools), default=str)) for e in accepted]
        rows.append(row)
    done = {r["env"] for r in rows if "error" not in r}
    if done:
        (Path(out) / SFT_DIR).mkdir(parents=True, exist_ok=True)
        for fmt, records in sft.items():
            path = Path(out) / SFT_DIR / f"{fmt}.jsonl"
            _write(path, [json.dumps(r) for r in merge_env_records(read_jsonl(path), records, done)])
    return rows


def merge_env_records(old: list[dict[str, Any]], new: list[dict[str, Any]], envs: set[str]) -> list[dict[str, Any]]:
    """An SFT file's records after exporting ``envs`` again: theirs replaced by ``new``, every other
    env's kept; grouped by env in name order, so exporting twice writes the same file."""
    kept = [r for r in old if r.get("env") not in envs]
    by_env: dict[str, list[dict[str, Any]]] = {}
    for r in kept + new:
        by_env.setdefault(str(r.get("env")), []).append(r)
    return [r for env in sorted(by_env) for r in by_env[env]]


def format_export_row(row: dict[str, Any]) -> str:
    return (f"{row['env']}: {row['tasks']} tasks appended as tasks {row['first_task']}.."
            f"{row['first_task'] + row['tasks'] - 1} in {row['folder']}")
