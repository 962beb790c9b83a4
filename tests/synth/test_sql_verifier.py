"""Templated sql-mode verifiers: facts for the LLM judge that tell a reference episode from a no-op,
made with the candidate and exported beside the code-mode verifier."""

from __future__ import annotations

import asyncio
import json

from synth.factory.queries import make_candidate
from synth.factory.sql_verifier import CRITERIA, sql_verifier_code
from synth.factory.template_writer import TemplateWriter


def test_facts_report_each_check_after_the_reference_and_after_a_no_op(lending_chains, sandbox) -> None:
    runtime, columns, chains = lending_chains
    writer = TemplateWriter.for_tools(runtime.tools)
    made = [asyncio.run(make_candidate(runtime, c, columns, None, sandbox, writer=writer, sql=True))
            for c in chains]
    writes = [e for e, c in made if c is not None and e.final_answer is None]
    assert writes
    initial = runtime.template.data

    async def facts(code: str, final: bytes) -> dict:
        return (await sandbox.run(code, initial, final, mode="sql")).result

    for episode in writes:
        assert episode.sql_verifier_code.startswith("def verify_task(")
        inst = runtime.instance()
        for call in episode.calls:
            asyncio.run(inst.call(call.tool, call.arguments))
        done = asyncio.run(facts(episode.sql_verifier_code, inst.snapshot()))
        inst.close()
        noop = asyncio.run(facts(episode.sql_verifier_code, initial))
        assert done["failed"] == 0 and done["passed"] == len(done["checks"]) >= 1
        assert noop["failed"] >= 1 and [c["check"] for c in noop["checks"]] == [c["check"] for c in done["checks"]]


def test_a_read_only_answer_is_handed_to_the_judge(sandbox, lending_chains) -> None:
    runtime = lending_chains[0]
    code = sql_verifier_code({"tables": {}, "answer": "Dune", "others": ["Emma"]})
    data = runtime.template.data
    facts = asyncio.run(sandbox.run(code, data, data, mode="sql")).result
    assert facts == {"checks": [], "passed": 0, "failed": 0, "expected_answer": "Dune",
                     "other_candidates": ["Emma"]}
    assert "expected_answer" in CRITERIA["success_criteria"]


def test_a_collateral_change_is_a_failed_fact(sandbox, lending_chains) -> None:
    """The reference's changes, plus a row of another table changed: that row is a failed check."""
    import sqlite3

    runtime = lending_chains[0]
    initial = runtime.template.data
    conn = sqlite3.connect(":memory:")
    conn.deserialize(initial)
    conn.execute("UPDATE books SET title = 'Gone' WHERE rowid = (SELECT min(rowid) FROM books)")
    conn.commit()
    changed = conn.serialize()
    conn.close()
    code = sql_verifier_code({"tables": {}})
    clean = asyncio.run(sandbox.run(code, initial, initial, mode="sql")).result
    dirty = asyncio.run(sandbox.run(code, initial, changed, mode="sql")).result
    assert clean == {"checks": [], "passed": 0, "failed": 0}
    assert dirty["failed"] == 1 and "every other books row as it was" in dirty["checks"][0]["check"]


def test_export_writes_the_sql_verifier_the_loader_reads(tmp_path, lending_chains, sandbox) -> None:
    from envfarm.catalog import Catalog, load_catalog
    from synth.factory.export import export_env

    runtime, columns, chains = lending_chains
    writer = TemplateWriter.for_tools(runtime.tools)
    episode = next(e for e, c in (asyncio.run(make_candidate(runtime, ch, columns, None, sandbox,
                                                              writer=writer, sql=True)) for ch in chains)
                   if c is not None and e.final_answer is None)
    source = tmp_path / "src"
    source.mkdir()
    bundle = runtime.bundle
    for name, rec in (("gen_scenario.jsonl", {"name": bundle.name, "description": bundle.description}),
                      ("gen_tasks.jsonl", {"scenario": bundle.name, "tasks": bundle.tasks}),
                      ("gen_db.jsonl", {"scenario": bundle.name, "db_schema": bundle.db_schema.model_dump()}),
                      ("gen_sample.jsonl", {"scenario": bundle.name, "sample_data": bundle.sample_data.model_dump()}),
                      ("gen_spec.jsonl", {"scenario": bundle.name, "api_spec": bundle.api_spec}),
                      ("gen_envs.jsonl", {"scenario": bundle.name, "full_code": bundle.code})):
        (source / name).write_text(json.dumps(rec) + "\n")
    row = export_env(Catalog({bundle.name: bundle}, [], source), bundle.name, tmp_path / "out", [episode])
    loaded = load_catalog(tmp_path / "out" / "factory_catalog")[bundle.name]
    sql = loaded.verifiers[row["first_task"]]
    assert sql.code == episode.sql_verifier_code and json.loads(sql.raw_response) == CRITERIA
    assert loaded.code_verifiers[row["first_task"]].code == episode.verifier_code
