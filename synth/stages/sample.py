"""Stage 4: sample rows, inserted in foreign-key order; accepted when at most 10 % fail.

Also the sample data's later life: rows the acceptance gate adds for a task (see below).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import weakref
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from envfarm.confined.template import execute_inserts
from synth import prompts
from synth._context import Meter, RunContext
from synth._correct import Attempt, self_correct
from synth._jsonl import JsonlStore
from synth._answers import SampleAnswer, parse_answer
from synth._parse import ParseError
from synth._sql import ddl_text, run_inserts


async def run_sample(ctx: RunContext, scenario: dict[str, Any]) -> bool:
    name = scenario["name"]
    tasks = ctx.stores.task.get(name)["tasks"]
    db_tables = ctx.stores.db.get(name)["db_schema"]["tables"]
    meter = Meter()

    async def evaluate(text: str) -> Attempt:
        try:
            tables = [t.model_dump() for t in parse_answer(text, SampleAnswer).tables]
        except ParseError as exc:
            return Attempt(ok=False, errors=[str(exc)])
        run = await asyncio.to_thread(run_inserts, db_tables, tables)
        ok = run.total > 0 and run.failure_rate <= ctx.config.max_failure_rate
        return Attempt(ok=ok, value=run, errors=run.errors, score=-run.failure_rate,
                       excerpt="\n".join(e.split("): ", 1)[-1] for e in run.errors[:20]) or text,
                       details={"inserts": run.rows, "failed": run.failed, "total": run.total})

    loop = await self_correct(ctx, meter, stage="sample", scenario=name,
                              messages=prompts.sample_messages(name, tasks, ddl_text(db_tables)),
                              evaluate=evaluate, executable=True)
    best = loop.best
    if loop.accepted:
        kept = [t for t in best.value.kept if t["insert_statements"]]
        ctx.stores.sample.append_once({"scenario": name, "tables_count": len(kept), "inserts_count": best.value.rows,
                                       "sample_data": {"tables": kept}})
    ctx.record(meter.report(stage="sample", scenario=name, ok=loop.accepted, attempts=loop.attempts,
                            errors=best.errors if best else [], details=best.details if best else {}))
    return loop.accepted


# -- sample-data repairs (made by the acceptance gate) ---------------------------------------------
#
# Persistence design. gen_sample.jsonl is append-only (one record per scenario) and the env, spec and
# gate stages all read it, so the gate cannot hold its sample record back until it is done. Instead
# every committed data repair (extra INSERTs that passed the re-check of the scenario's accepted
# tasks) is appended, once, to its own append-only file, synth_sample_patches.jsonl, keyed by
# (scenario, seq); that append is the commit point. When a scenario's gate finishes, its
# gen_sample.jsonl record is replaced by base + patches, marked with the seqs it already holds
# ("data_repairs"), and the whole file is rewritten atomically (temp file, fsync, os.replace). A
# kill at any moment leaves either the old file or the new one; the next run folds in whatever
# patches the record does not list yet, so nothing is lost or applied twice, and the file keeps one
# record per scenario. The patch file is not an AWM file: the farm only ever reads gen_sample.jsonl.

PATCH_FILE = "synth_sample_patches.jsonl"
_PATCH_STORES: weakref.WeakKeyDictionary[Any, JsonlStore] = weakref.WeakKeyDictionary()


def _by_patch(rec: dict[str, Any]) -> Hashable:
    return (rec["scenario"], int(rec["seq"]))


def patch_store(ctx: RunContext) -> JsonlStore:
    """The run's synth_sample_patches.jsonl (one store per run, like the stage stores)."""
    store = _PATCH_STORES.get(ctx.stores)
    if store is None:
        store = _PATCH_STORES[ctx.stores] = JsonlStore(ctx.config.out_dir / PATCH_FILE, _by_patch)
    return store


def patches(ctx: RunContext, name: str) -> list[dict[str, Any]]:
    """The committed data repairs of a scenario, in commit order."""
    return sorted((p for p in patch_store(ctx) if p["scenario"] == name), key=lambda p: int(p["seq"]))


def merge_tables(tables: list[dict[str, Any]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tables`` with the statements of ``extra`` appended to their tables (new tables at the end)."""
    out = [{**t, "insert_statements": list(t["insert_statements"])} for t in tables]
    index = {t["table_name"]: t for t in out}
    for t in extra:
        if t["table_name"] in index:
            index[t["table_name"]]["insert_statements"] += t["insert_statements"]
        else:
            index[t["table_name"]] = {"table_name": t["table_name"], "reasoning": t.get("reasoning", ""),
                                      "insert_statements": list(t["insert_statements"])}
            out.append(index[t["table_name"]])
    return out


def effective_sample(ctx: RunContext, name: str) -> dict[str, Any]:
    """The scenario's sample record with every committed repair folded in (and listed)."""
    rec = ctx.stores.sample.get(name)
    folded = set(rec.get("data_repairs", []))
    todo = [p for p in patches(ctx, name) if int(p["seq"]) not in folded]
    if not todo:
        return rec
    tables = rec["sample_data"]["tables"]
    for p in todo:
        tables = merge_tables(tables, p["tables"])
    rows = sum(len(t["insert_statements"]) for t in tables)
    return {**rec, "tables_count": len(tables), "inserts_count": rows, "sample_data": {"tables": tables},
            "data_repairs": sorted(folded | {int(p["seq"]) for p in todo})}


def finalize_sample(ctx: RunContext, name: str) -> bool:
    """Fold committed repairs into gen_sample.jsonl (atomic whole-file rewrite); True if it changed."""
    rec = effective_sample(ctx, name)
    if rec is ctx.stores.sample.get(name):
        ctx.stores.sample.path.with_name(ctx.stores.sample.path.name + ".tmp").unlink(missing_ok=True)
        return False
    ctx.stores.sample.replace(rec)
    return True


@dataclass
class ExtraRows:
    """INSERTs run on top of an existing database: what ran, what failed."""

    tables: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    errors: list[str] = field(default_factory=list)


def run_extra_inserts(data: bytes, tables: list[dict[str, Any]]) -> ExtraRows:
    """Execute ``tables``' INSERTs for real on a copy of ``data`` (FK order, foreign keys on).

    All or nothing: any statement that is not a single INSERT, or that fails after every other
    statement had its chance (rows may reference rows added later), is an error.
    """
    out = ExtraRows(tables=[t for t in tables if t["insert_statements"]])
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(data)
        for t in out.tables:
            for sql in t["insert_statements"]:
                if not re.match(r"\s*insert\s", sql, re.IGNORECASE):
                    out.errors.append(f"not an INSERT (only new rows may be added): {sql[:300]}")
        if not out.errors:
            done = execute_inserts(conn, [(t["table_name"], t["insert_statements"])
                                          for t in out.tables])
            out.rows = len(done.ok)
            out.errors += [f"INSERT into {t} failed ({exc}): {s[:300]}"
                           for t, _, s, exc in done.failed]
    finally:
        conn.close()
    if not out.tables:
        out.errors.append("no INSERT statements")
    return out
