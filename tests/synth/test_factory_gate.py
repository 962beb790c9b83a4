"""The solving gate: an honest agent given only the written request must pass the verifier
through a farm, and no hack probe may (a no-op with a plausible wrong answer among them)."""

from __future__ import annotations

import asyncio

import pytest

from synth.factory.execute import DROP_IDLE_WRITE
from synth.factory.gate import (
    DROP_HACKABLE,
    DROP_UNSOLVED,
    Candidate,
    code_judge,
    gate_batch,
)
from synth.factory.model import Binding, Chain, Step, task_text
from synth.factory.verifier import verifier_code, wrong_answers
from tests.fakes.factory_agent import ScriptedWorld, run_episodes, scripted_solver
from tests.synth.factory_run import request


def _run(runtime, columns, chains, mock, sandbox):
    return run_episodes(runtime, chains, mock, sandbox, columns)


def _verdict(sandbox, code, initial, final, answer):
    return asyncio.run(sandbox.run(code, initial, final, answer, mode="code")).result["result"]


def test_accepted_only_what_the_agent_solves_from_the_written_request(lending_chains, mock_openai, sandbox) -> None:
    runtime, columns, chains = lending_chains
    world = ScriptedWorld()
    world.install(mock_openai)
    eps = _run(runtime, columns, chains, mock_openai, sandbox)
    accepted = [e for e in eps if e.accepted]
    assert len(accepted) >= 5, [(e.reason, e.detail) for e in eps]
    assert {e.final_answer is None for e in accepted} == {True, False}  # changes and questions
    agent_tasks = {r.messages[1]["content"] for r in mock_openai.requests if r.stage == ""}
    for e in accepted:
        assert task_text(e) in world.requests and task_text(e) in agent_tasks  # the agent saw the written text
    initial = runtime.template.data
    for e in (e for e in accepted if e.final_answer is not None):  # "The author is Frank Herbert." and the like
        other = "Jane Austen" if "Herbert" in e.final_answer else "Frank Herbert"
        assert _verdict(sandbox, e.verifier_code, initial, initial, f"The author is {other}.") == "others"
        assert _verdict(sandbox, e.verifier_code, initial, initial, e.final_answer) == "complete"
        both = f"{e.final_answer} Or maybe {other}."  # a dump of candidates is no answer
        assert _verdict(sandbox, e.verifier_code, initial, initial, both) == "others"


def test_a_request_that_asks_for_something_else_is_unsolved(lending_chains, mock_openai, sandbox) -> None:
    """The replay of the chain passes (the old gate accepted these); the agent doing what the
    request says does not."""
    runtime, columns, chains = lending_chains
    # the text names another borrower than the chain used
    ScriptedWorld(misread=lambda text: text.replace("'Ann'", "'Zoe'")).install(mock_openai)
    eps = _run(runtime, columns, chains, mock_openai, sandbox)
    lends = [e for e in eps if any(c.tool == "lend_book" for c in e.calls) and e.messages
             and e.reason != "ambiguous"]
    assert lends and all(e.reason == DROP_UNSOLVED and not e.accepted for e in lends), \
        [(e.reason, e.detail) for e in lends]
    assert "the agent following the request" in lends[0].detail


def test_an_unknown_request_is_not_accepted(lending_chains, mock_openai, sandbox) -> None:
    """What an emptied QueryGen prompt gives: a request no agent can act on."""
    runtime, columns, chains = lending_chains
    world = ScriptedWorld()
    world.querygen = request("Please help me with my account.")  # well-formed, says nothing
    mock_openai.clear()
    world.install(mock_openai)
    eps = _run(runtime, columns, chains[:4], mock_openai, sandbox)
    assert not any(e.accepted for e in eps)
    written = [e for e in eps if e.messages]
    assert written and {e.reason for e in written} <= {DROP_UNSOLVED, DROP_HACKABLE, "ambiguous"}


def test_a_verifier_a_guess_passes_is_dropped(lending_chains, mock_openai, sandbox) -> None:
    runtime = lending_chains[0]
    lax = ('def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n'
           '    ok = final_answer is not None and "0" in final_answer\n'
           '    return {"result": "complete" if ok else "others"}\n')
    world = ScriptedWorld()
    world.install(mock_openai)

    async def main():
        candidates = [Candidate("How many loans are open?", lax, ["The count is 10."]),
                      Candidate("How many loans are open?", verifier_code({"tables": {}, "answer": 7}),
                                ["The count is 10."])]
        solver = scripted_solver(mock_openai)
        try:
            return await gate_batch(runtime.bundle, candidates, solver, code_judge(sandbox))
        finally:
            await solver.aclose()

    lax_result, strict_result = asyncio.run(main())
    assert (lax_result.accepted, lax_result.reason) == (False, DROP_HACKABLE)
    assert "guess" in lax_result.detail  # "0", and the candidate's own "The count is 10."
    assert strict_result.reason == DROP_UNSOLVED  # not guessable; the agent did not know it either


@pytest.mark.parametrize(("value", "answer", "passes"), [
    (7, "There are 7 loans.", True), (7, "There are 17 loans.", False), (7, "It is 7.5 now", False),
    (1250, "You owe 1,250 in total.", True), (2.5, "The fee is 2.50.", True),
    ("Dune", "The title is dune.", True), ("Dune", "The title is Dunes.", False),
    ("Dune", "I could not find it.", False),
])
def test_answers_are_checked_exactly(lending_chains, sandbox, value, answer, passes) -> None:
    data = lending_chains[0].template.data
    assert _verdict(sandbox, verifier_code({"tables": {}, "answer": value}), data, data, answer) == \
        ("complete" if passes else "others")


def test_wrong_answers_state_other_values_or_done() -> None:
    result = [{"title": "Dune"}, {"title": "Emma"}]
    assert wrong_answers(("[].title", "Dune"), result, ["Dune", "Zed"], []) == \
        ["The title is Emma.", "The title is Zed."]
    assert wrong_answers(("count", 3), {"count": 3}, [], []) == ["I checked: there is no count to report."]
    assert wrong_answers(None, {}, [], ["Ann", 2]) == ["Done, I've taken care of that.", "Done: Ann, 2."]


def test_a_write_that_changes_nothing_is_dropped(lending_chains, mock_openai, sandbox) -> None:
    runtime, columns, _ = lending_chains
    twice = Chain(env="lending_1", chain_id="return-twice", steps=[
        Step(tool="return_loan", bindings={"loan_id": Binding(kind="db", table="loans", column="id")}),
        Step(tool="return_loan", bindings={"loan_id": Binding(kind="step", step=0, field="loan_id")})])
    (ep,) = _run(runtime, columns, [twice], mock_openai, sandbox)
    assert (ep.accepted, ep.reason) == (False, DROP_IDLE_WRITE) and "step 1 return_loan" in ep.detail
    assert mock_openai.requests == []  # dropped before any LLM call
