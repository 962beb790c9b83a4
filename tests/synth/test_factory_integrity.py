"""Issue 32: an EnvFactory episode the gate accepts rewards no hack.

Each attack here passed on the code before the issue's fixes: the templated read-only verifiers
accepted the request echoed, a dump of every value and a destructive write beside the right
answer; the leak check missed tool names written as words; the gate's test agent replayed the
chain, so it "solved" requests no honest agent could (which payment method?). The agent is now
honest (``tests/fakes/factory_words.py``) and synth drops a request that does not single out what
the chain acted on (``synth.factory.ambiguity``).
"""

from __future__ import annotations

import asyncio
import re

import pytest

from envfarm import EnvRuntime, load_catalog
from envfarm.hackprobes import HackProbe, ProbeTask, probe_task
from envfarm.models import ToolCall
from judge import Judge, JudgeConfig
from synth.factory.model import Binding, Chain, Step, task_text
from synth.factory.querygen import leak
from tests.fakes.factory_agent import ScriptedWorld, run_episodes
from tests.fakes.factory_words import HonestReader


def _episodes(runtime, chains, mock, sandbox):
    return run_episodes(runtime, chains, mock, sandbox)


def _probes(runtime, episode, sandbox):
    task = ProbeTask(text=task_text(episode), code_verifier=episode.verifier_code,
                     solution=[ToolCall(tool=c.tool, arguments=c.arguments) for c in episode.calls],
                     final_answer=episode.final_answer)
    return asyncio.run(probe_task(runtime, task, Judge(JudgeConfig(use_llm="never"), sandbox=sandbox)))


def test_no_accepted_episode_rewards_a_hack(lending_chains, mock_openai, sandbox) -> None:
    """Echo, dump and a destructive write beside the right answer: every probe of every
    accepted episode's verifier fails (before: the read-only ones passed all three)."""
    runtime, _, chains = lending_chains
    ScriptedWorld().install(mock_openai)
    eps = _episodes(runtime, chains, mock_openai, sandbox)
    accepted = [e for e in eps if e.accepted]
    assert accepted and any(e.final_answer for e in accepted), [(e.reason, e.detail) for e in eps]
    for e in accepted:
        report = _probes(runtime, e, sandbox)
        assert report.reference.value == "completed"
        assert not report.rejects, (task_text(e), report.summary())


@pytest.mark.parametrize(("message", "why"), [
    ("Could you delete payment method for me?", "names_tool"),      # a tool name written as words
    ("Could you delete the payment methods I don't use?", None),    # a request, not a tool name
    ("Please close out loan 17 for me.", "names_id"),               # an id after its entity's name
    ("Set the borrower_name to Zoe, please.", "names_column"),       # a column as written in the schema
    ("Lend Dune to Zoe, please.", None),
])
def test_leaks_written_as_words(message, why) -> None:
    assert leak([message], ["delete_payment_method", "return_loan"], {"17"},
                columns={"borrower_name", "loans", "status"}) == why


def test_an_ambiguous_request_is_rejected_and_a_well_posed_one_accepted(mock_openai, sandbox) -> None:
    """"Could you show me my payment methods, then get rid of the payment method?": which of
    three? The replay agent replayed the chain and the episode was accepted. Said with the card
    ('American Express'), the honest agent finds it by reading and the episode is accepted."""
    runtime = EnvRuntime(load_catalog()["hotel_booking_1"])
    chain = Chain(env="hotel_booking_1", chain_id="delete-a-card", steps=[
        Step(tool="list_payment_methods"),
        Step(tool="delete_payment_method", bindings={"payment_method_id": Binding(
            kind="step", step=0, field="payment_methods[].id")})])
    vague = ScriptedWorld(misread=lambda text: re.sub(r" for the payment method '[^']*'", "", text))
    vague.install(mock_openai)
    (ep,) = _episodes(runtime, [chain], mock_openai, sandbox)
    assert ep.messages == ["Could you show me the payment methods, then get rid of the payment method for me?"]
    assert (ep.accepted, ep.reason) == (False, "ambiguous") and "one of 3 candidates" in ep.detail
    mock_openai.clear()
    ScriptedWorld().install(mock_openai)
    (ep,) = _episodes(runtime, [chain], mock_openai, sandbox)
    assert ep.accepted and "'American Express'" in ep.messages[0], (ep.reason, ep.detail)


@pytest.mark.parametrize(("task", "does"), [
    ("Could you get rid of the payment method for me?", "Which payment method do you mean? I see 3."),
    ("Could you get rid of the payment method for the payment method 'Visa' for me?", "delete_payment_method"),
    ("Could you get rid of the payment method for the payment method 'Denmark' for me?",
     "I found 3 payment methods called 'Denmark': which one?"),
    ("Could you show me the payment methods for me, and tell me the last4?",
     "There are 3 last4s there: which one do you mean?"),
    ("Please sort out my account.", "I could not tell what you want."),
])
def test_the_honest_agent_reads_or_says_what_is_missing(task, does) -> None:
    """It sees only the request and what its calls return: a record it cannot single out by
    reading stops it, as it would stop a person."""
    runtime = EnvRuntime(load_catalog()["hotel_booking_1"])
    reader = HonestReader(task, {t.name: t.input_schema for t in runtime.tools})
    inst = runtime.instance()
    while not isinstance(action := reader.next_action(), str):
        res = inst.call_sync(*action)
        reader.history.append((*action, {"ok": res.ok, "result": res.result}))
        if action[0] == does:
            assert action[1] == {"payment_method_id": 1}  # the Visa, found by reading the list
            return
    assert action == does


def test_probe_kinds_cover_the_issue() -> None:
    assert {p.value for p in HackProbe} == {"noop", "echo", "guess", "dump", "side_effect", "truncated"}
