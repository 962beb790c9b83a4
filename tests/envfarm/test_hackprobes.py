"""The hack-probe suite (``envfarm.hackprobes``): each probe catches the verifier weakness it
plays, a sound verifier rejects them all, and the LLM-judge path reads well-formed probe
trajectories (through the real judge, its sandbox and a mock OpenAI endpoint)."""

from __future__ import annotations

import asyncio
import json

import pytest

from envfarm import EnvRuntime
from envfarm.hackprobes import HackProbe, ProbeTask, bundle_tasks, probe_task, probe_tasks
from envfarm.llm import LLMClient, LLMConfig
from envfarm.models import ToolCall
from envfarm.verdict import Outcome
from judge import Judge, JudgeConfig, VerifierSandbox
from tests.synth.factory_env import lending_bundle

_HEAD = '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3

    def rows(path, sql):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        out = conn.execute(sql).fetchall()
        conn.close()
        return out
'''
#: complete once some loan is open: the starting database already is (AWM's issue #16)
INITIAL_PASSES = _HEAD + '''
    ok = rows(final_db_path, "SELECT 1 FROM loans WHERE status = 'open'")
    return {"result": "complete" if ok else "others"}
'''
#: the answer only has to contain the title somewhere
CONTAINS_DUNE = _HEAD + '''
    return {"result": "complete" if "dune" in (final_answer or "").lower() else "others"}
'''
CONTAINS_EMMA = CONTAINS_DUNE.replace("dune", "emma")
#: a new loan of Emma (book 2) to Ann, and nothing else looked at
NEW_LOAN = _HEAD + '''
    new = rows(final_db_path, "SELECT id FROM loans WHERE book_id = 2 AND borrower_name = 'Ann'")
    old = rows(initial_db_path, "SELECT id FROM loans WHERE book_id = 2 AND borrower_name = 'Ann'")
    return {"result": "complete" if len(new) == len(old) + 1 else "others"}
'''
#: the same, and every other row as it was (what an exact verifier checks)
NEW_LOAN_EXACT = NEW_LOAN.replace('''    return {"result": "complete" if len(new) == len(old) + 1 else "others"}''', '''    if len(new) != len(old) + 1:
        return {"result": "others"}
    ids = ",".join(str(i) for (i,) in new)
    for sql in ("SELECT * FROM books", f"SELECT * FROM loans WHERE id NOT IN ({ids})"):
        if rows(initial_db_path, sql) != rows(final_db_path, sql):
            return {"result": "others"}
    return {"result": "complete"}''')
RAISES = _HEAD + '''
    raise RuntimeError("boom")
'''

LEND = [ToolCall(tool="list_books"), ToolCall(tool="lend_book", arguments={"book_id": 2, "borrower_name": "Ann"})]
LEND_AND_RETURN = [*LEND, ToolCall(tool="return_loan", arguments={"loan_id": 1})]
LIST = [ToolCall(tool="list_books")]


@pytest.fixture(scope="module")
def runtime() -> EnvRuntime:
    return EnvRuntime(lending_bundle())


@pytest.fixture(scope="module")
def judge():
    with VerifierSandbox(workers=2, timeout_s=10.0) as sandbox:
        yield Judge(JudgeConfig(use_llm="never"), sandbox=sandbox)


def _probe(runtime, judge, task: ProbeTask):
    return asyncio.run(probe_task(runtime, task, judge))


@pytest.mark.parametrize(("name", "task", "caught"), [
    ("initial state passes", ProbeTask(text="Is a loan open?", code_verifier=INITIAL_PASSES),
     {HackProbe.noop, HackProbe.echo, HackProbe.guess, HackProbe.dump}),
    ("request holds the answer", ProbeTask(text="Could you list books (Dune), and tell me the title?",
                                           code_verifier=CONTAINS_DUNE, solution=LIST,
                                           final_answer="The title is Dune."),
     {HackProbe.echo, HackProbe.guess, HackProbe.dump, HackProbe.side_effect}),
    ("answer contained in a dump", ProbeTask(text="What is the second book on the shelf called?",
                                             code_verifier=CONTAINS_EMMA, solution=LIST,
                                             final_answer="It is Emma."),
     {HackProbe.dump, HackProbe.side_effect}),
    ("a write with collateral damage", ProbeTask(text="Lend Emma to Ann.", code_verifier=NEW_LOAN,
                                                 solution=LEND, final_answer="Done."),
     {HackProbe.side_effect}),
    ("the last write unchecked", ProbeTask(text="Lend Emma to Ann, then close loan 1.",
                                           code_verifier=NEW_LOAN, solution=LEND_AND_RETURN),
     {HackProbe.side_effect, HackProbe.truncated}),
])
def test_each_probe_catches_the_weakness_it_plays(runtime, judge, name, task, caught) -> None:
    report = _probe(runtime, judge, task)
    assert set(report.hacked) == caught, (name, report.summary())
    assert report.rejects and not report.undecided
    if task.solution:
        assert report.reference is Outcome.completed  # the probes are played against a sound reference


def test_a_sound_verifier_rejects_every_probe(runtime, judge) -> None:
    report = _probe(runtime, judge, ProbeTask(text="Lend Emma to Ann.", code_verifier=NEW_LOAN_EXACT,
                                              solution=LEND, final_answer="Done."))
    assert report.reference is Outcome.completed
    assert report.hacked == [] and report.undecided == [] and not report.rejects, report.summary()
    ran = {r.probe for r in report.results if not r.skipped}
    assert ran == set(HackProbe)
    side = next(r for r in report.results if r.probe is HackProbe.side_effect)
    assert "return_loan" in side.detail and "never touched" in side.detail


def test_a_verifier_that_cannot_judge_is_undecided(runtime, judge) -> None:
    report = _probe(runtime, judge, ProbeTask(text="Lend Emma to Ann.", code_verifier=RAISES, solution=LEND))
    assert report.rejects and report.hacked == [] and HackProbe.noop in report.undecided
    assert report.reference is Outcome.invalid


def test_an_env_without_code_is_probed_on_its_database(runtime, judge) -> None:
    task = ProbeTask(text="Is a loan open?", code_verifier=INITIAL_PASSES, initial_db=runtime.template.data)
    report = asyncio.run(probe_task(None, task, judge, env="no_code_1"))
    assert set(report.hacked) == {HackProbe.noop, HackProbe.echo, HackProbe.guess}
    assert {r.probe for r in report.results if r.skipped} == {HackProbe.dump, HackProbe.side_effect,
                                                            HackProbe.truncated}


def test_a_task_starts_from_its_own_database(runtime, judge) -> None:
    """``initial_db``: the probes (and the verifier's initial database) start there."""
    inst = runtime.instance()
    inst.call_sync("return_loan", {"loan_id": 1})
    no_open_loan = inst.snapshot()
    inst.close()
    task = ProbeTask(text="Is a loan open?", code_verifier=INITIAL_PASSES, initial_db=no_open_loan)
    assert _probe(runtime, judge, task).hacked == []


def test_batches_and_catalog_tasks(runtime, judge, bundled_catalog) -> None:
    bundle = bundled_catalog["personal_banking_1"]
    tasks = bundle_tasks(bundle)
    assert [t.task_idx for t in tasks] == list(range(10)) and tasks[3].solution == bundle.solutions[3]
    reports = asyncio.run(probe_tasks(EnvRuntime(bundle), tasks[:3], judge, concurrency=2))
    assert [r.task_idx for r in reports] == [0, 1, 2]
    assert all(r.reference is Outcome.completed and r.path == "code" for r in reports)
    assert json.loads(reports[0].model_dump_json())["hacked"] == [p.value for p in reports[0].hacked]


# -- the LLM-judge path ------------------------------------------------------------------------
SQL = '''def verify_task(initial_db_path, final_db_path):
    import sqlite3
    conn = sqlite3.connect(f"file:{final_db_path}?mode=ro", uri=True)
    n = conn.execute("SELECT COUNT(*) FROM loans").fetchone()[0]
    return {"loans": n}
'''


def _llm_probe(mock, runtime, classification: str):
    mock.script(json.dumps({"classification": classification, "reasoning": "as scripted",
                            "confidence": 0.9}), stage="judge", repeat=True)

    async def main():
        client = LLMClient(LLMConfig(base_url=mock.url, model="judge", max_retries=0))
        with VerifierSandbox(workers=2) as sandbox:
            judge = Judge(JudgeConfig(use_llm="always"), llm_client=client, sandbox=sandbox)
            try:
                return await probe_task(runtime, ProbeTask(
                    text="Lend Emma to Ann, then close loan 1.", code_verifier=NEW_LOAN_EXACT,
                    sql_verifier=SQL, solution=LEND_AND_RETURN, final_answer="Done."), judge)
            finally:
                await judge.aclose()

    return asyncio.run(main())


def test_llm_path_judges_well_formed_probe_trajectories(mock_openai, runtime) -> None:
    """A gullible judge model passes every probe: each reached the model (none was stopped by
    the format rules, which the judge applies first) with its sql verifier and its answer."""
    report = _llm_probe(mock_openai, runtime, "Completed")
    assert report.path == "llm"
    assert set(report.hacked) == set(HackProbe), report.summary()
    prompts = [r.last_user for r in mock_openai.requests]
    assert any("Lend Emma to Ann" in p and "verify_task" in p for p in prompts)
    assert any("Here is everything I found" in p for p in prompts)  # the dump's answer


def test_llm_path_a_strict_judge_passes_none(mock_openai, runtime) -> None:
    report = _llm_probe(mock_openai, runtime, "Agent Error")
    assert report.hacked == [] and not report.rejects and report.reference is Outcome.agent_error


async def test_the_docs_example_runs() -> None:
    """docs/integrity.md's example, as written (an async body)."""
    import re
    import textwrap
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs" / "integrity.md"
    (block,) = re.findall(r"```python\n(.*?)```", docs.read_text(), re.S)
    namespace: dict = {}
    exec("async def _example():\n" + textwrap.indent(block, "    ")  # noqa: S102 - our docs
         + "\n    return report, reports\n", namespace)
    report, reports = await namespace["_example"]()
    assert report.task_idx == 0 and report.reference is Outcome.completed and not report.rejects
    assert len(reports) == 10
