"""The template request writer (no LLM): explicit requests that state every call and value, never a
tool name, the same text for the same chain and values, and QueryGen's place in make_candidate."""

from __future__ import annotations

import asyncio
import json

from synth.factory.execute import execute_drawing
from synth.factory.queries import make_candidate
from synth.factory.querygen import QueryStats
from synth.factory.template_writer import WRITER, TemplateWriter, step_sentence


def test_a_step_is_its_summary_then_every_argument_as_json() -> None:
    assert step_sentence("Lend a book.", {"book_id": 3, "borrower_name": "Ada"}) == \
        'Lend a book with {"book_id": 3, "borrower_name": "Ada"}.'
    assert step_sentence("List books", {}) == "List books."


def _executed(lending_chains):
    runtime, columns, chains = lending_chains
    runs = [asyncio.run(execute_drawing(runtime, c, columns, 0))[-1].executed for c in chains]
    return runtime, [ex for ex in runs if not ex.drop]


def test_requests_state_each_call_and_never_a_tool_name(lending_chains) -> None:
    runtime, executed = _executed(lending_chains)
    writer = TemplateWriter.for_tools(runtime.tools)
    tools = [t.name for t in runtime.tools]
    assert executed
    for ex in executed:
        plan, turns, why = asyncio.run(writer.write("lending_1", ex, tools, None, QueryStats()))
        text = plan.turns[0].message
        assert why == "" and turns == [len(ex.calls)] and WRITER in plan.profile
        assert text == writer.message(ex)  # deterministic: the same chain and values, the same text
        for k, call in enumerate(ex.calls, 1):
            assert f"Step {k}: {writer.summaries[call.tool].rstrip('.')}" in text
            assert json.dumps(call.arguments) in text if call.arguments else True
        assert not any(f" {tool}" in f" {text}" for tool in tools)


def test_a_summary_that_names_a_tool_is_refused(lending_chains) -> None:
    runtime, executed = _executed(lending_chains)
    ex = executed[0]
    writer = TemplateWriter({c.tool: f"Run {c.tool}" for c in ex.calls})
    stats = QueryStats()
    plan, _, why = asyncio.run(writer.write("lending_1", ex, [t.name for t in runtime.tools], None, stats))
    assert plan is None and why == "names_tool" and stats.names_tool == 1


def test_make_candidate_takes_the_writer_instead_of_an_llm(lending_chains, sandbox) -> None:
    runtime, columns, chains = lending_chains
    writer = TemplateWriter.for_tools(runtime.tools)
    made = [asyncio.run(make_candidate(runtime, c, columns, None, sandbox, writer=writer)) for c in chains]
    ready = [(e, c) for e, c in made if c is not None]
    assert ready  # llm=None: any QueryGen call would have failed
    for episode, candidate in ready:
        first = episode.calls[0]
        assert candidate.task == episode.messages[0] and episode.verifier_code
        assert episode.messages[0].startswith("Step 1: " + step_sentence(writer.summaries[first.tool],
                                                                         first.arguments))
