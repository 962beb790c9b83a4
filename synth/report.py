"""Per-stage report records (synth_report.jsonl) and the paper's Table 1 / Table 2."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from synth._jsonl import read_jsonl
from synth.config import FILES, STAGES
from synth.factory.report import factory_rows, render_factory


class StageReport(BaseModel):
    """What one stage did for one scenario (or one task): outcome, tries, errors, tokens, cost."""

    model_config = ConfigDict(extra="forbid")

    stage: str = Field(description="stage name (scenario stage records are per candidate)")
    scenario: str = Field(description="scenario name")
    task_idx: int | None = Field(None, description="task index for per-task stages")
    ok: bool = Field(description="accepted")
    attempts: int = Field(0, description="LLM generations tried")
    errors: list[str] = Field(default_factory=list, description="why attempts failed (or warnings when ok)")
    llm_calls: int = Field(0, description="LLM calls, summaries included")
    prompt_tokens: int = Field(0, description="prompt tokens")
    completion_tokens: int = Field(0, description="completion tokens")
    cost_usd: float = Field(0.0, description="cost of the calls")
    elapsed_s: float = Field(0.0, description="wall time")
    details: dict[str, Any] = Field(default_factory=dict, description="stage-specific facts")

    def key(self) -> tuple[str, str, int | None]:
        return (self.stage, self.scenario, self.task_idx)


def report_key(rec: dict[str, Any]) -> tuple[str, str, int | None]:
    """Key of synth_report.jsonl records."""
    return (rec["stage"], rec["scenario"], rec.get("task_idx"))


def gate_skipped(rec: dict[str, Any]) -> bool:
    """A gate record of a ``--no-gate`` run: the task was never checked, so it is not solvable (yet)."""
    return rec.get("stage") == "gate" and bool(rec.get("details", {}).get("skipped"))


def gate_passed(rec: dict[str, Any]) -> bool:
    """A gate record whose task a reference solution proved solvable."""
    return rec.get("stage") == "gate" and bool(rec.get("ok")) and not gate_skipped(rec)


def table1(out_dir: Path) -> list[dict[str, Any]]:
    """Per stage: runs, success %, mean tries, tokens, cost (Table 1 of the AWM paper, plus the gate
    and its sample-data repairs: one ``data_repair`` run per task that asked for rows, ok = committed).
    Gate records of ``--no-gate`` runs are counted apart (``skipped``), never as successes."""
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in read_jsonl(out_dir / FILES["report"]):
        rows[rec["stage"]].append(rec)
    out = []
    for stage in [*STAGES, "gate", "data_repair"]:
        skipped = [r for r in rows.get(stage, []) if gate_skipped(r)]
        recs = [r for r in rows.get(stage, []) if not gate_skipped(r)]
        if not recs and not skipped:
            continue
        ok = sum(1 for r in recs if r["ok"])
        out.append({
            "stage": stage,
            "runs": len(recs),
            "skipped": len(skipped),
            "success_pct": 100.0 * ok / len(recs) if recs else 0.0,
            "mean_tries": sum(r.get("attempts", 0) for r in recs) / len(recs) if recs else 0.0,
            "tokens": sum(r.get("prompt_tokens", 0) + r.get("completion_tokens", 0) for r in recs),
            "cost_usd": sum(r.get("cost_usd", 0.0) for r in recs),
        })
    return out


def table2(out_dir: Path) -> list[dict[str, Any]]:
    """Per env: tables, sample rows, tools, tool defects, code lines, solvable tasks (proven by the
    gate), unverified tasks (``--no-gate``), verifier discrimination."""
    envs = {r["scenario"]: r for r in read_jsonl(out_dir / FILES["env"])}
    dbs = {r["scenario"]: r for r in read_jsonl(out_dir / FILES["db"])}
    samples = {r["scenario"]: r for r in read_jsonl(out_dir / FILES["sample"])}
    tasks = {r["scenario"]: r for r in read_jsonl(out_dir / FILES["task"])}
    reports = read_jsonl(out_dir / FILES["report"])
    env_reports = {r["scenario"]: r for r in reports if r["stage"] == "env" and r["ok"]}
    gates: dict[str, list[dict[str, Any]]] = defaultdict(list)
    added: dict[str, int] = defaultdict(int)
    for r in reports:
        if r["stage"] == "gate":
            gates[r["scenario"]].append(r)
        elif r["stage"] == "data_repair" and r["ok"]:
            added[r["scenario"]] += int(r.get("details", {}).get("rows_added", 0))
    out = []
    for name, env in envs.items():
        gated = gates.get(name, [])
        solvable = sum(1 for g in gated if gate_passed(g))
        unverified = sum(1 for g in gated if gate_skipped(g))
        # Discrimination over the tasks whose verifier got to judge a reference run.
        judged = [g for g in gated if g.get("details", {}).get("discriminates") is not None]
        discriminating = sum(1 for g in judged if g["details"]["discriminates"])
        out.append({
            "env": name,
            "tables": len(dbs.get(name, {}).get("db_schema", {}).get("tables", [])),
            "sample_rows": samples.get(name, {}).get("inserts_count", 0),
            "rows_added_by_gate": added.get(name, 0),
            "tools": env_reports.get(name, {}).get("details", {}).get("tools", 0),
            "tool_defects": int(env_reports.get(name, {}).get("details", {}).get("defects", 0)),
            "code_lines": len(env["full_code"].splitlines()),
            "tasks": len(tasks.get(name, {}).get("tasks", [])),
            "solvable_tasks": solvable,
            "unverified_tasks": unverified,
            "gated_tasks": len(gated) - unverified,
            "discrimination_pct": 100.0 * discriminating / len(judged) if judged else 0.0,
        })
    return out


def render_tables(out_dir: Path) -> str:
    """Both tables as plain text (what ``envfarm synth report`` prints)."""
    t1, t2 = table1(out_dir), table2(out_dir)
    lines = ["Table 1 - per stage",
             f"{'stage':<11} {'runs':>5} {'success%':>9} {'skipped':>7} {'tries':>6} {'tokens':>10} {'cost $':>9}"]
    for r in t1:
        lines.append(f"{r['stage']:<11} {r['runs']:>5} {r['success_pct']:>9.1f} {r['skipped']:>7} "
                     f"{r['mean_tries']:>6.2f} {r['tokens']:>10} {r['cost_usd']:>9.4f}")
    lines += ["", "Table 2 - per environment",
              f"{'env':<28} {'tables':>6} {'rows':>5} {'+rows':>5} {'tools':>5} {'defects':>7} {'lines':>6} "
              f"{'solvable':>9} {'unverified':>10} {'discrim%':>9}"]
    for r in t2:
        lines.append(f"{r['env']:<28} {r['tables']:>6} {r['sample_rows']:>5} {r['rows_added_by_gate']:>5} "
                     f"{r['tools']:>5} {r['tool_defects']:>7} {r['code_lines']:>6} "
                     f"{r['solvable_tasks']:>4}/{r['tasks']:<4} {r['unverified_tasks']:>10} {r['discrimination_pct']:>9.1f}")
    if t2:
        n = len(t2)
        keys = ("tables", "sample_rows", "rows_added_by_gate", "tools", "tool_defects", "code_lines")
        mean = {k: sum(r[k] for r in t2) / n for k in keys}
        lines.append(f"{'mean':<28} {mean['tables']:>6.1f} {mean['sample_rows']:>5.0f} {mean['rows_added_by_gate']:>5.1f} "
                     f"{mean['tools']:>5.1f} {mean['tool_defects']:>7.1f} {mean['code_lines']:>6.0f}")
        unverified = sum(r["unverified_tasks"] for r in t2)
        if unverified:
            lines.append(f"\n{unverified} task(s) unverified: the acceptance gate was skipped (--no-gate); "
                         "they are not counted as solvable.")
    return "\n".join(lines + render_factory(factory_rows(out_dir)))


def report_json(out_dir: Path) -> str:
    """Both tables as JSON."""
    return json.dumps({"table1": table1(out_dir), "table2": table2(out_dir), "factory": factory_rows(out_dir)},
                      indent=2)
