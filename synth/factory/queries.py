"""``synth queries``: execute each sampled chain, write its request, gate it, store the episode.

One record per chain in ``<out>/factory/<env>/episodes.jsonl`` (accepted or with the reason it was
dropped), appended and fsync'd as soon as it is decided, keyed by ``chain_id``: a killed run
resumes where it stopped and never writes a chain twice. The acceptance gate has two parts:
synth's replay check (``envfarm.check.check_solution``: the recorded calls replayed on a fresh
instance pass the verifier in the judge's sandbox, and a no-op does not), the request singles out
everything the chain acted on (``synth.factory.ambiguity``), then the solving gate
(``synth.factory.gate``: no hack probe passes the verifier, and an agent given only the written
request passes it through a farm).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from envfarm.check import check_solution
from envfarm.confined.runtime import EnvRuntime
from envfarm.models import ToolCall
from synth._jsonl import JsonlStore, read_jsonl
from synth._probe import load_runtime
from synth.guard import read_written_tables
from synth.factory.ambiguity import unresolved
from synth.factory.dbvalues import column_values, db_columns, db_source, strict_id
from synth.factory.execute import Executed, diff_rows, execute_chain, execute_drawing
from synth.factory.fields import field_values
from synth.factory.gate import (
    DROP_SOLVER_ERROR,
    Candidate,
    Solver,
    code_judge,
    gate_batch,
)
from synth.factory.graph import factory_dir
from synth.factory.model import Chain, Episode, task_text
from synth.factory.scenario import DEFAULT_KEEP, scenario_state
from synth.factory.querygen import LLM_ERROR, QueryStats, write_query
from synth.factory.run import CHAINS_FILE, catalog_envs
from synth.factory.sql_verifier import sql_verifier_code
from synth.factory.verifier import (
    checks_something,
    expected_state,
    key_value,
    read_only_expected,
    verifier_code,
    volatile_columns,
    wrong_answers,
)

EPISODES_FILE = "episodes.jsonl"
DROP_AMBIGUOUS = "ambiguous"            # the request does not single out what the chain acted on
DROP_NO_KEY_VALUE = "no_key_value"      # a read-only chain whose answer has nothing to state
DROP_NOTHING_STABLE = "nothing_stable"  # every changed column differs run to run
DROP_GATE = "gate"

M = TypeVar("M", bound=BaseModel)


def _episode(ex: Executed, reason: str = "", detail: str = "", **kw: Any) -> Episode:
    return Episode(env=ex.chain.env, chain_id=ex.chain.chain_id, calls=ex.calls, messages=kw.pop("messages", []),
                   verifier_code=kw.pop("verifier_code", ""), reason=reason, detail=detail, **kw)


async def make_candidate(runtime: EnvRuntime, chain: Chain, columns: Any, llm: Any, sandbox: Any,
                         seed: int = 0, tries: int = 5, ignore: Iterable[str] = (),
                         keep: float | None = DEFAULT_KEEP, writer: Any = None,
                         sql: bool = False) -> tuple[Episode, Candidate | None]:
    """One chain through execution, QueryGen and the replay check: the episode (rejected ones say
    why) and, when it may go on, what the solving gate needs (``synth.factory.gate``).

    A chain whose calls fail with the values drawn is run again with other draws (``tries`` in
    all, each avoiding the values that failed): a cancelled reservation cannot be cancelled, another
    one can; then twice more with optional parameters filled too (``execute_drawing``). A request
    that does not single out what the chain acted on is dropped (``ambiguous``). ``ignore``: tables
    the env's reads write (``read_written_tables``), which the verifier leaves out. ``keep``: the
    chain's scenario starts from a database of its own (``synth.factory.scenario``: the sample
    data with each unreferenced row kept with this probability); None: the env's sample data.
    ``writer``: what writes the request instead of QueryGen on ``llm`` (an object with QueryGen's
    ``write_query`` as its ``write`` method, e.g. ``synth.factory.template_writer.TemplateWriter``).
    ``sql``: also template an sql-mode verifier (facts for the LLM judge), checked with the replay.
    """
    state, initial = ({}, runtime.template.data) if keep is None else scenario_state(
        runtime.template.data, runtime.bundle.code or "", chain.chain_id, keep)
    columns = db_columns(initial) if state else columns
    last = (await execute_drawing(runtime, chain, columns, seed, tries=tries, initial=initial))[-1]
    ex = last.executed
    if ex.drop:
        return _episode(ex, ex.drop, ex.detail, task_state=state), None
    answer = None
    if ex.changed:
        again = await execute_chain(runtime, chain, columns, **last.kwargs)
        first = diff_rows(initial, ex.final)
        volatile = volatile_columns(first, diff_rows(initial, again.final)) if not again.drop else set()
        given = {str(v) for c in ex.calls for v in c.arguments.values()}
        expected = expected_state(first, volatile, given)
    else:
        tail = ex.calls[-1]
        answer = key_value(tail.result, named=isinstance(tail.result, dict) and any(
            strict_id(k) for k in tail.arguments))
        if answer is None:
            return _episode(ex, DROP_NO_KEY_VALUE, "the last call returned no value a user would ask for"), None
    final_answer = f"The {answer[0].rsplit('.', 1)[-1].strip('[]')} is {answer[1]}." if answer else None
    if answer is not None:
        expected = read_only_expected(answer[1], _candidates(initial, ex, answer, columns), final_answer)
    if not checks_something(expected):
        return _episode(ex, DROP_NOTHING_STABLE, "every changed column differs between two runs", task_state=state), None
    code = verifier_code(expected, sorted(ignore))
    sql_code = sql_verifier_code(expected, sorted(ignore)) if sql else ""
    stats = QueryStats()
    names = [*columns, *(c for cols in columns.values() for c in cols)]
    tools = [t.name for t in runtime.tools]
    plan, turn_calls, why = await (writer or QueryGen(llm)).write(chain.env, ex, tools, answer, stats, columns=names)
    usage = {k: getattr(stats, k) for k in ("prompt_tokens", "completion_tokens", "cost_usd")}
    if plan is None:
        return _episode(ex, why, usage=usage, verifier_code=code, final_answer=final_answer, task_state=state), None
    calls = [ToolCall(tool=c.tool, arguments=c.arguments) for c in ex.calls]
    check = await check_solution(runtime, code, calls, sandbox, final_answer=final_answer, initial=initial,
                                 sql_verifier=sql_code or None)
    episode = _episode(ex, usage=usage, messages=[t.message for t in plan.turns], turn_calls=turn_calls,
                       query=plan.model_dump(), verifier_code=code, final_answer=final_answer, task_state=state,
                       sql_verifier_code=sql_code)
    if not check.solvable:
        episode.reason, episode.detail = DROP_GATE, "; ".join(check.problems)[:400]
        return episode, None
    vague = unresolved(ex, episode.messages, initial, columns, answer, runtime.bundle.code or "")
    if vague:
        episode.reason, episode.detail = DROP_AMBIGUOUS, vague[:400]
        return episode, None
    return episode, Candidate(task=task_text(episode), verifier_code=code,
                              wrong_answers=_wrong_answers(initial, ex, answer, columns),
                              solution=calls, final_answer=final_answer, task_state=state, initial_db=initial)


class QueryGen:
    """QueryGen on an LLM as a request writer (``make_candidate``'s default)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    async def write(self, env: str, ex: Executed, tools: list[str], answer: tuple[str, Any] | None,
                    stats: QueryStats, **kw: Any) -> tuple[Any, list[int], str]:
        return await write_query(self.llm, env, ex, tools, answer, stats, **kw)


def _column_values(data: bytes, answer: tuple[str, Any] | None, columns: Any) -> list[Any]:
    """The values of the database column the asked field names (``title`` -> ``books.title``)."""
    leaf = answer[0].rsplit(".", 1)[-1].strip("[]") if answer else ""
    where = db_source(leaf, columns) if leaf else None
    return column_values(data, *where, limit=500) if where else []


def _candidates(data: bytes, ex: Executed, answer: tuple[str, Any], columns: Any) -> list[Any]:
    """What else the answer could have named: the asked field's other values in the last answer
    and in its database column (an answer that states one of them too is a dump, or a guess)."""
    return [*field_values(ex.calls[-1].result, answer[0]), *_column_values(data, answer, columns)]


def _wrong_answers(data: bytes, ex: Executed, answer: tuple[str, Any] | None, columns: Any) -> list[str]:
    stated = [v for c in ex.calls for k, v in c.arguments.items() if not strict_id(k)]
    return wrong_answers(answer, ex.calls[-1].result, _column_values(data, answer, columns), stated)


async def make_episodes(runtime: EnvRuntime, chains: list[Chain], columns: Any, llm: Any, sandbox: Any,
                        solver: Solver, *, seed: int = 0, concurrency: int = 4,
                        keep: float | None = DEFAULT_KEEP) -> list[Episode]:
    """Episodes of ``chains``: candidates made ``concurrency`` at a time, then gated together on
    one farm (an agent solves each written request; see ``synth.factory.gate``)."""
    limit = asyncio.Semaphore(max(1, concurrency))
    ignore = await read_written_tables(runtime)

    async def one(chain: Chain) -> tuple[Episode, Candidate | None]:
        async with limit:
            return await make_candidate(runtime, chain, columns, llm, sandbox, seed, ignore=ignore, keep=keep)

    made = await asyncio.gather(*(one(c) for c in chains))
    waiting = [(e, c) for e, c in made if c is not None]
    results = await gate_batch(runtime.bundle, [c for _, c in waiting], solver, code_judge(sandbox),
                               concurrency=concurrency, runtime=runtime)
    for (episode, _), result in zip(waiting, results, strict=True):
        episode.accepted, episode.reason, episode.detail = result.accepted, result.reason, result.detail
    return [e for e, _ in made]


async def make_episode(runtime: EnvRuntime, chain: Chain, columns: Any, llm: Any, sandbox: Any,
                       solver: Solver, seed: int = 0) -> Episode:
    """One chain all the way through the gate."""
    (episode,) = await make_episodes(runtime, [chain], columns, llm, sandbox, solver, seed=seed)
    return episode


def valid_records(records: list[dict[str, Any]], model: type[M]) -> tuple[list[M], int]:
    """The records that fit ``model``, and how many did not (a hand-edited or foreign line is
    counted, not fatal)."""
    out, bad = [], 0
    for rec in records:
        try:
            out.append(model.model_validate(rec))
        except ValidationError:
            bad += 1
    return out, bad


async def _run_chains(runtime: EnvRuntime, chains: list[Chain], columns: Any, store: JsonlStore, *, llm: Any,
                      sandbox: Any, solver: Solver, seed: int, concurrency: int,
                      batch: int = 16, keep: float | None = DEFAULT_KEEP) -> tuple[int, int]:
    """(episodes stored, chains left for a re-run because the LLM or agent endpoint failed); each batch's
    episodes are stored as soon as the gate decided them."""
    added = retry_later = 0
    for start in range(0, len(chains), batch):
        for episode in await make_episodes(runtime, chains[start:start + batch], columns, llm, sandbox, solver,
                                           seed=seed, concurrency=concurrency, keep=keep):
            if episode.reason in (LLM_ERROR, DROP_SOLVER_ERROR):  # an endpoint failed: not stored, a re-run tries again
                retry_later += 1
            else:
                added += store.append_once(episode.model_dump(mode="json"))
    return added, retry_later


async def queries_catalog(catalog_path: Path | None, out: Path, *, llm: Any, sandbox: Any, solver: Solver,
                          envs: list[str] | None = None, seed: int = 0, limit: int | None = None,
                          concurrency: int = 4, batch: int = 16, tool_timeout_s: float = 10.0,
                          keep: float | None = DEFAULT_KEEP) -> list[dict[str, Any]]:
    """Episodes for every chain of every env not done yet (``concurrency`` chains at a time, gated
    ``batch`` at a time, each batch's episodes stored as soon as they are decided); one summary row per env."""
    catalog, names = catalog_envs(catalog_path, envs)
    rows = []
    for name in names:
        folder = factory_dir(out, name)
        chains, bad = valid_records(read_jsonl(folder / CHAINS_FILE), Chain)
        if not chains:
            rows.append({"env": name, "error": f"no chains at {folder / CHAINS_FILE}: run `envfarm synth chains` first"})
            continue
        runtime, why = load_runtime(catalog[name], tool_timeout_s)
        if runtime is None:
            rows.append({"env": name, "error": why})
            continue
        columns = db_columns(runtime.template.data)
        store = JsonlStore(folder / EPISODES_FILE, lambda r: r["chain_id"])
        todo = [c for c in chains if c.chain_id not in store]  # the rest was done by an earlier run
        added, retry_later = await _run_chains(runtime, todo[:limit] if limit is not None else todo, columns,
                                               store, llm=llm, sandbox=sandbox, solver=solver, seed=seed,
                                               concurrency=concurrency, batch=batch, keep=keep)
        episodes = list(store)
        rows.append({"env": name, "chains": len(chains), "bad_chain_records": bad, "new": added, "episodes": len(episodes),
                     "accepted": sum(bool(e.get("accepted")) for e in episodes), "llm_errors": retry_later})
    return rows


def format_queries_row(row: dict[str, Any]) -> str:
    text = (f"{row['env']}: {row['new']} new episodes, {row['accepted']} accepted of {row['episodes']} "
            f"from {row['chains']} chains")
    if row.get("bad_chain_records"):
        text += f"; {row['bad_chain_records']} malformed chain records skipped"
    if row.get("llm_errors"):
        text += f"; {row['llm_errors']} chains left for a re-run (the LLM or agent endpoint failed)"
    return text
