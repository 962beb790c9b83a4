"""QueryGen: executed chains, LLM-written requests, templated verifiers, synth's gate, resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envfarm.llm import LLMClient, LLMConfig
from synth._jsonl import read_jsonl
from synth.factory.execute import DROP_CALL_FAILED
from synth.factory.graph import factory_dir
from synth.factory.model import Binding, Chain, Step, task_text
from synth.factory.queries import EPISODES_FILE, make_episode
from tests.fakes.mock_openai import MockOpenAI, Reply
from tests.fakes.factory_agent import (
    ScriptedWorld,
    script_refine,
    script_world,
    scripted_solver,
    staged_messages,
)
from tests.synth.factory_run import (
    ENV,
    prepare_run,
    queries_args,
    request,
    script_queries,
)

REPO = Path(__file__).resolve().parents[2]


async def _episodes(runtime, columns, chains, mock, sandbox):
    solver = scripted_solver(mock)
    try:
        async with LLMClient(LLMConfig(base_url=mock.url, model="mock", max_retries=0)) as llm:
            return [await make_episode(runtime, c, columns, llm, sandbox, solver) for c in chains]
    finally:
        await solver.aclose()


def test_lending_chains_become_gated_episodes(lending_chains, mock_openai, sandbox) -> None:
    runtime, columns, chains = lending_chains
    world = script_world(mock_openai)
    eps = asyncio.run(_episodes(runtime, columns, chains, mock_openai, sandbox))
    accepted = [e for e in eps if e.accepted]
    assert len(accepted) >= 5, [(e.reason, e.detail) for e in eps]
    writes = [e for e in accepted if e.final_answer is None]
    reads = [e for e in accepted if e.final_answer is not None]
    assert writes and reads
    for e in accepted:
        assert task_text(e) in world.requests and all(c.ok for c in e.calls)
        assert len(e.messages) == len(e.turn_calls) and sum(e.turn_calls) == len(e.calls)
        assert e.usage["prompt_tokens"] > 0
    initial = runtime.template.data

    async def verdicts(e, final_answer):
        return (await sandbox.run(e.verifier_code, initial, initial, final_answer, mode="code")).result["result"]

    # a no-op fails every verifier; a read-only one also fails with an answer lacking the value
    assert all(asyncio.run(verdicts(e, None)) == "others" for e in accepted)
    assert all(asyncio.run(verdicts(e, "I could not find it.")) == "others" for e in reads)
    assert all(asyncio.run(verdicts(e, e.final_answer)) == "complete" for e in reads)


def test_failing_chain_is_dropped_before_any_llm_call(lending_chains, mock_openai, sandbox) -> None:
    runtime, columns, _ = lending_chains
    chain = Chain(env="lending_1", chain_id="failing", steps=[
        Step(tool="list_books"), Step(tool="yearly_report", bindings={"year": Binding(kind="task")})])
    (ep,) = asyncio.run(_episodes(runtime, columns, [chain], mock_openai, sandbox))
    assert not ep.accepted and ep.reason == DROP_CALL_FAILED and "yearly_report" in ep.detail
    assert mock_openai.requests == []


def test_malformed_answer_is_retried_then_counted(lending_chains, mock_openai, sandbox) -> None:
    runtime, columns, chains = lending_chains
    mock_openai.script('{"messages": ["Lend', '{"messages": []}', '{"text": "hi"}', request(), stage="queries")
    script_refine(mock_openai)
    first, second = asyncio.run(_episodes(runtime, columns, chains[:2], mock_openai, sandbox))
    assert not first.accepted and first.reason == "malformed" and first.verifier_code
    assert second.reason != "malformed"  # the third answer was bad, the retry good
    assert len([r for r in mock_openai.requests if r.stage == "queries"]) == 4


def test_answers_naming_a_tool_or_a_raw_id_are_rejected(lending_chains, mock_openai, sandbox) -> None:
    runtime, columns, chains = lending_chains
    lend = next(c for c in chains if c.steps[-1].tool == "return_loan")
    mock_openai.script(request("Please run return_loan on my loan."), request("Please close out my loan #2."),
                       stage="queries")
    script_refine(mock_openai)
    named, numbered = asyncio.run(_episodes(runtime, columns, [lend, lend], mock_openai, sandbox))
    assert (named.reason, numbered.reason) == ("names_tool", "names_id")
    assert not named.accepted and not numbered.accepted


def test_cli_queries_on_a_bundled_env_and_report(tmp_path, mock_openai) -> None:
    from synth.cli import app

    chains = prepare_run(tmp_path, n=8)
    with (factory_dir(tmp_path, ENV) / "chains.jsonl").open("a") as fh:
        fh.write(json.dumps({"env": ENV, "chain_id": "hand-edited", "steps": "none"}) + "\n")
    script_queries(mock_openai)
    run = CliRunner()
    res = run.invoke(app, queries_args(mock_openai, tmp_path), catch_exceptions=False)
    assert res.exit_code == 0 and "1 malformed chain records skipped" in res.output, res.output
    eps = read_jsonl(factory_dir(tmp_path, ENV) / EPISODES_FILE)
    assert sorted(e["chain_id"] for e in eps) == sorted(c.chain_id for c in chains)
    accepted = [e for e in eps if e["accepted"]]
    assert accepted and f"{len(accepted)} accepted of 8" in res.output
    assert all(e["reason"] for e in eps if not e["accepted"])
    res = run.invoke(app, queries_args(mock_openai, tmp_path), catch_exceptions=False)
    assert "0 new episodes" in res.output and len(read_jsonl(factory_dir(tmp_path, ENV) / EPISODES_FILE)) == 8
    report = run.invoke(app, ["report", "--out", str(tmp_path), "--json"], catch_exceptions=False)
    (row,) = json.loads(report.output)["factory"]
    assert row["chains"] == 9 and row["processed"] == 8 and row["accepted"] == len(accepted)
    assert row["executable"] >= row["accepted"] and sum(row["drops"].values()) == 8 - len(accepted)
    assert row["tokens"] > 0 and row["kept_edges"] > 0
    assert "Table 3 - EnvFactory" in run.invoke(app, ["report", "--out", str(tmp_path)]).output


def test_llm_errors_are_left_for_a_rerun(tmp_path, mock_openai, sandbox) -> None:
    from synth.factory.queries import queries_catalog

    prepare_run(tmp_path, n=8)

    async def run() -> dict:
        async with LLMClient(LLMConfig(base_url=mock_openai.url, model="mock", max_retries=0)) as llm:
            solver = scripted_solver(mock_openai)
            try:
                (row,) = await queries_catalog(None, tmp_path, llm=llm, sandbox=sandbox, solver=solver, envs=[ENV],
                                               concurrency=3)
            finally:
                await solver.aclose()
        return row

    mock_openai.script(Reply.error(500), stage="queries", repeat=True)
    failed = asyncio.run(run())
    stored = read_jsonl(factory_dir(tmp_path, ENV) / EPISODES_FILE)
    assert failed["llm_errors"] >= 1 and len(stored) == failed["new"] == 8 - failed["llm_errors"]
    assert not any(e["reason"] == "llm_error" for e in stored)
    mock_openai.clear()
    script_queries(mock_openai)
    again = asyncio.run(run())
    assert again["new"] == failed["llm_errors"] and again["episodes"] == 8 and again["accepted"] >= 1


@pytest.mark.slow
def test_kill_9_and_resume_without_duplicates(tmp_path) -> None:
    chains = prepare_run(tmp_path, n=10)
    path = factory_dir(tmp_path, ENV) / EPISODES_FILE
    with MockOpenAI(latency_s=0.1) as mock:
        script_queries(mock)
        # batches of 2: episodes land a few at a time, so the kill falls between two of them
        cmd = [sys.executable, "-m", "tests.synth.factory_cli", *queries_args(mock, tmp_path), "--batch", "2"]
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while len(read_jsonl(path)) < 2:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "no progress"
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            proc.stderr.close()
        killed_at = len(read_jsonl(path))
        assert killed_at < 10  # really interrupted
        final = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
        assert final.returncode == 0, final.stderr[-3000:]
    eps = read_jsonl(path)
    assert len(path.read_text().splitlines()) == len(eps) == 10
    assert sorted(e["chain_id"] for e in eps) == sorted(c.chain_id for c in chains)
    assert f"{10 - killed_at} new episodes" in final.stdout


def test_templated_verifier_checks_added_changed_and_deleted_rows(lending_chains, sandbox) -> None:
    from envfarm.template import open_memory_db
    from synth.factory.execute import diff_rows
    from synth.factory.verifier import expected_state, verifier_code

    runtime = lending_chains[0]
    initial = runtime.template.data
    conn = open_memory_db(False)
    conn.deserialize(initial)
    conn.execute("DELETE FROM loans WHERE id = 1")
    conn.execute("UPDATE books SET title = 'Dune Messiah' WHERE id = 1")
    conn.execute("INSERT INTO loans (id, book_id, borrower_name, status) VALUES (5, 2, 'Bo', 'open')")
    conn.commit()
    final = conn.serialize()
    conn.execute("INSERT INTO loans (id, book_id, borrower_name, status) VALUES (1, 1, 'Ann', 'open')")
    conn.commit()
    not_deleted = conn.serialize()
    conn.close()
    expected = expected_state(diff_rows(initial, final), set())
    assert expected["tables"]["loans"]["deleted"] == [1]
    assert expected["tables"]["books"]["changed"] == [(1, {"title": "Dune Messiah"})]
    assert expected["tables"]["loans"]["added"] == [{"book_id": 2, "borrower_name": "Bo", "status": "open"}]
    code = verifier_code(expected)

    def verdict(after: bytes) -> str:
        return asyncio.run(sandbox.run(code, initial, after, None, mode="code")).result["result"]

    assert (verdict(final), verdict(initial), verdict(not_deleted)) == ("complete", "others", "others")


def test_times_the_env_stamps_are_not_checked() -> None:
    import datetime

    from synth.factory.verifier import expected_state

    now = datetime.datetime.now().isoformat(sep=" ", timespec="seconds")
    row = {"id": 9, "amount": 5.0, "booked": now, "posted": now[:10], "check_in": "2027-03-14 15:00"}
    diff = {"t": {"added": [row], "changed": [], "deleted": []}}
    (want,) = expected_state(diff, set(), given={"2027-03-14 15:00"})["tables"]["t"]["added"]
    assert want == {"amount": 5.0, "check_in": "2027-03-14 15:00"}  # the id, now and today left out


def test_query_stages_and_answer_shapes() -> None:
    from synth._parse import ParseError
    from synth.factory.querygen import (
        MAX_TURN_CALLS,
        parse_query,
        parse_refined,
        plan_turns,
    )

    turn = {"subgoals": ["lend the book", "return it"], "goal": "Lend Dune to Ann, then return it.",
            "message": {"role": "user", "content": "Lend Dune to Ann and bring it back."}}
    answer = {"profile": "A librarian.", "scenario": "Ann borrows a book for a day.", "turns": [turn]}
    plan = parse_query(json.dumps(answer), [2])
    assert [t.message for t in plan.turns] == ["Lend Dune to Ann and bring it back."]
    assert plan.profile == "A librarian." and plan.turns[0].subgoals == ["lend the book", "return it"]
    as_object = {**answer, "turns": {"turn 1": {**turn, "subgoals": "lend and return"}}}
    assert parse_query(json.dumps(as_object), [1]).turns[0].subgoals == ["lend and return"]
    with pytest.raises(ParseError, match="1 turns for 2 planned"):
        parse_query(json.dumps(answer), [1, 1])
    with pytest.raises(ParseError, match="2 subgoals for its 3 calls"):
        parse_query(json.dumps(answer), [3])
    for missing in ("profile", "scenario"):  # every stage is checked
        with pytest.raises(ParseError):
            parse_query(json.dumps({k: v for k, v in answer.items() if k != missing}), [2])
    with pytest.raises(ParseError):
        parse_query(json.dumps({**answer, "turns": [{**turn, "goal": ""}]}), [2])
    with pytest.raises(ParseError):
        parse_query('{"messages": ["Lend Dune to Ann."]}', [1])  # the message alone skips the stages
    refined = parse_refined('{"messages": [{"role": "user", "content": "Can Ann borrow Dune till tomorrow?"}]}', plan)
    assert refined == ["Can Ann borrow Dune till tomorrow?"]
    with pytest.raises(ParseError, match="repeats its goal"):     # the calibration skipped: the goal copied
        parse_refined('{"messages": ["lend Dune to Ann, then return it"]}', plan)
    with pytest.raises(ParseError, match="2 messages for 1 turns"):
        parse_refined('{"messages": ["Lend it.", "Return it."]}', plan)
    for n in range(1, 12):
        for seed in range(20):
            sizes = plan_turns(n, str(seed))
            assert sum(sizes) == n and 1 <= len(sizes) <= max(3, -(-n // MAX_TURN_CALLS))
            assert all(1 <= s <= MAX_TURN_CALLS for s in sizes)


def test_a_wrong_turn_count_is_repaired_with_the_error(lending_chains, mock_openai, sandbox) -> None:
    runtime, columns, chains = lending_chains
    chain = next(c for c in chains if len(c.steps) == 3)
    world = script_world(mock_openai)
    mock_openai.clear()
    mock_openai.script(staged_messages(["one", "two", "three", "four"], [1, 1, 1, 1]), world.querygen,
                       stage="queries")
    world.install(mock_openai)
    (ep,) = asyncio.run(_episodes(runtime, columns, [chain], mock_openai, sandbox))
    assert ep.accepted, (ep.reason, ep.detail)
    assert len(ep.messages) == len(ep.turn_calls) and sum(ep.turn_calls) == 3
    repair = [r for r in mock_openai.requests if r.stage == "queries"][1]
    assert f"4 turns for {len(ep.turn_calls)} planned" in repair.last_user
    assert ep.query["profile"] and [t["message"] for t in ep.query["turns"]] == ep.messages


def test_agent_endpoint_errors_are_left_for_a_rerun(tmp_path, mock_openai, sandbox) -> None:
    from synth.factory.queries import queries_catalog

    prepare_run(tmp_path, n=6)
    world = ScriptedWorld()
    mock_openai.script(world.querygen, stage="queries", repeat=True)
    script_refine(mock_openai)
    down = mock_openai.script(Reply.error(500), match=lambda r: r.stage == "", repeat=True)  # the agent's

    async def run() -> dict:
        solver = scripted_solver(mock_openai)
        try:
            async with LLMClient(LLMConfig(base_url=mock_openai.url, model="mock", max_retries=0)) as llm:
                (row,) = await queries_catalog(None, tmp_path, llm=llm, sandbox=sandbox, solver=solver, envs=[ENV])
        finally:
            await solver.aclose()
        return row

    failed = asyncio.run(run())
    stored = read_jsonl(factory_dir(tmp_path, ENV) / EPISODES_FILE)
    assert failed["llm_errors"] >= 1 and not any(e["accepted"] or e["reason"] == "solver_error" for e in stored)
    mock_openai.rules.remove(down)  # the agent endpoint is back
    mock_openai.script(world.agent, match=lambda r: r.stage == "", repeat=True)
    again = asyncio.run(run())
    assert again["new"] == failed["llm_errors"] and again["episodes"] == 6 and again["accepted"] >= 1


def test_the_request_is_the_calibrated_refinement_not_the_draft(lending_chains, mock_openai, sandbox) -> None:
    """Two stages: the draft's goals go to the refinement, whose messages are the request; a
    refinement that copies a goal is sent back with the error."""
    runtime, columns, chains = lending_chains
    chain = next(c for c in chains if c.steps[-1].tool == "return_loan")
    world = ScriptedWorld()

    def draft(req):  # the scripted plan, its drafted messages blanked out
        plan = json.loads(world.querygen(req))
        return json.dumps({**plan, "turns": [{**t, "message": ""} for t in plan["turns"]]})

    def copies_goals(req):
        plan = json.loads(req.last_user.split("The plan, one entry per turn:\n", 1)[1])
        return json.dumps({"messages": [t["goal"] for t in plan["turns"]]})

    mock_openai.script(draft, stage="queries", repeat=True)
    mock_openai.script(copies_goals, lambda req: json.dumps({"messages": world.requests[-1].split("\n\n")}),
                       stage="queries_refine")
    mock_openai.script(world.agent, match=lambda r: r.stage == "", repeat=True)
    (ep,) = asyncio.run(_episodes(runtime, columns, [chain], mock_openai, sandbox))
    assert ep.accepted, (ep.reason, ep.detail)
    assert task_text(ep) == world.requests[-1] and [t["message"] for t in ep.query["turns"]] == ep.messages
    refine = [r for r in mock_openai.requests if r.stage == "queries_refine"]
    assert len(refine) == 2 and "repeats its goal" in refine[1].last_user
    assert all(t["goal"] in refine[0].last_user for t in ep.query["turns"])  # the refinement saw the draft
