"""The acceptance gate: an agent solves the WRITTEN request through a farm.

A candidate episode (executed chain, templated verifier, written request) becomes a task of an
in-process farm built for the batch: the env's own tasks, then one task per candidate with its
verifier. For each candidate:

1. the hack-probe suite (``envfarm.hackprobes``) plays a no-op, the request echoed, plausible
   wrong answers (the candidate's own: other values of the asked column, or "Done" for a
   change), a dump of every value the reads return, the reference with an unrelated destructive
   write, and the reference without its last write; a verifier that rewards any of them, or
   cannot judge one, drops the episode (``hackable``);
2. the solver (an agent reading only the task text) runs an episode on a fresh lease; the episode
   is accepted only when the farm's verifier says that trajectory completed the task
   (``unsolved`` otherwise: the request does not say what the chain did, or cannot be done).

The solver is handed in: synth sits below the trainer, so whoever composes the pipeline wraps the
trainer's agent loop with :class:`AgentSolver` (``trainer.episode.run_episode`` + any policy).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envfarm.catalog import Catalog
from envfarm.client import ASGITransport, EnvfarmError, Farm
from envfarm.errors import SynthesisError
from envfarm.farm import FarmConfig, FarmCore, PoolConfig, build_app
from envfarm.hackprobes import HackReport, ProbeTask, probe_tasks
from envfarm.models import EnvBundle, ToolCall, Verifier
from envfarm.runtime import EnvRuntime
from envfarm.verdict import Verdict
from judge import Judge, JudgeConfig

DROP_HACKABLE = "hackable"     # a hack probe passes the verifier (or it cannot judge one)
DROP_UNSOLVED = "unsolved"     # the agent following the written request did not pass it
DROP_SOLVER_ERROR = "solver_error"  # the agent's episode ended without a verdict (endpoint down)


@dataclass
class Solved:
    """What the agent's episode on one task came to."""

    success: bool
    valid: bool = True        # False: no verdict on the agent (its endpoint or the farm failed)
    reason: str = ""
    final_answer: str | None = None


#: (farm, env, task_idx) -> the agent's episode on that task, judged by the farm
Solver = Callable[[Farm, str, int], Awaitable[Solved]]


class AgentSolver:
    """The trainer's agent loop as a solver: ``run_episode(farm, policy, env, task_idx, config=)``
    (``trainer.episode.run_episode``) with any policy (an OpenAI-compatible endpoint, scripted).
    ``aclose()`` closes the policy's client."""

    def __init__(self, run_episode: Callable[..., Awaitable[Any]], policy: Any, config: Any = None) -> None:
        self.run_episode, self.policy, self.config = run_episode, policy, config

    async def __call__(self, farm: Farm, env: str, task_idx: int) -> Solved:
        r = await self.run_episode(farm, self.policy, env, task_idx, config=self.config)
        return Solved(success=bool(r.success), valid=bool(r.valid), final_answer=r.trajectory.final_answer,
                      reason=f"{r.end.value}, {r.outcome}: {r.reason}"[:300])

    async def aclose(self) -> None:
        close = getattr(self.policy, "aclose", None)
        if close is not None:
            await close()


@dataclass
class Candidate:
    """One episode waiting for the gate: its farm task text, verifier, plausible wrong answers
    (the probes' guesses), and the reference calls and answer the probes build on."""

    task: str
    verifier_code: str
    wrong_answers: list[str]
    solution: list[ToolCall] | None = None
    final_answer: str | None = None
    #: the scenario's own starting database: rows of the env's it lacks, and the database
    task_state: dict[str, list[int]] = field(default_factory=dict)
    initial_db: bytes | None = None

    def probe_task(self) -> ProbeTask:
        return ProbeTask(text=self.task, code_verifier=self.verifier_code, solution=self.solution,
                         final_answer=self.final_answer, guesses=self.wrong_answers,
                         initial_db=self.initial_db)


@dataclass
class GateResult:
    accepted: bool
    reason: str = ""
    detail: str = ""


class _Borrowed:
    """The run's judge lent to a gate farm: the farm closes what it is handed, but not this."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge

    async def verify(self, code: str | None, initial_db: bytes, final_db: bytes, *,
                     final_answer: str | None = None, context: Any = None) -> Verdict:
        return await self.judge.verify(code, initial_db, final_db, final_answer=final_answer,
                                       context=context)

    async def aclose(self) -> None:
        return None


def code_judge(sandbox: Any) -> Judge:
    """The judge in code mode on ``sandbox`` (the templated verifiers decide alone)."""
    return Judge(JudgeConfig(use_llm="never", check_format=False), sandbox=sandbox)


@asynccontextmanager
async def gate_farm(base: EnvBundle, candidates: list[Candidate], judge: Judge) -> AsyncIterator[tuple[Farm, int]]:
    """An in-process farm serving ``base`` with the candidates appended as tasks; yields the farm
    client and the task index of the first candidate."""
    first = len(base.tasks)
    bundle = base.model_copy(update={
        "tasks": [*base.tasks, *(c.task for c in candidates)],
        "code_verifiers": {**base.code_verifiers, **{
            first + i: Verifier(task_idx=first + i, task=c.task, code=c.verifier_code)
            for i, c in enumerate(candidates)}},
        "task_states": {**base.task_states, **{first + i: c.task_state for i, c in enumerate(candidates)
                                               if c.task_state}}})
    core = FarmCore(FarmConfig(envs=[bundle.name], pool=PoolConfig(warm=2)),
                    catalog=Catalog({bundle.name: bundle}, [], Path(".")),
                    runtimes={bundle.name: EnvRuntime(bundle)}, verifier=lambda: _Borrowed(judge))
    app = build_app(core)
    async with app.router.lifespan_context(app), Farm("http://gate", transport=ASGITransport(app)) as farm:
        yield farm, first


async def gate_one(farm: Farm, env: str, task_idx: int, probes: HackReport, solver: Solver) -> GateResult:
    """The two checks of one candidate (module doc); never raises for a bad episode."""
    if probes.rejects:
        return GateResult(False, DROP_HACKABLE, probes.summary()[:400])
    try:
        solved = await solver(farm, env, task_idx)
    except EnvfarmError as exc:
        return GateResult(False, DROP_SOLVER_ERROR, f"{type(exc).__name__}: {exc}"[:400])
    if not solved.valid:
        return GateResult(False, DROP_SOLVER_ERROR, solved.reason)
    if not solved.success:
        return GateResult(False, DROP_UNSOLVED, f"the agent following the request: {solved.reason}"[:400])
    return GateResult(True)


async def gate_batch(base: EnvBundle, candidates: list[Candidate], solver: Solver, judge: Judge, *,
                     concurrency: int = 4, runtime: EnvRuntime | None = None) -> list[GateResult]:
    """Gate every candidate on one farm built for the batch, ``concurrency`` at a time.
    ``runtime``: ``base`` compiled already (the probes play on it)."""
    if not candidates:
        return []
    reports = await probe_tasks(runtime or EnvRuntime(base), [c.probe_task() for c in candidates], judge,
                                env=base.name, concurrency=concurrency)
    limit = asyncio.Semaphore(max(1, concurrency))
    async with gate_farm(base, candidates, judge) as (farm, first):
        async def one(i: int, report: HackReport) -> GateResult:
            async with limit:
                return await gate_one(farm, base.name, first + i, report, solver)

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(reports))))


@dataclass(frozen=True)
class AgentEndpoint:
    """The OpenAI-compatible endpoint of the agent that solves requests on the command line."""

    base_url: str
    model: str
    api_key: str = "EMPTY"
    max_turns: int = 20


#: endpoint -> solver; the composition root (``envfarm.cli``) registers the trainer's agent loop
_AGENT_LOOPS: list[Callable[[AgentEndpoint], Solver]] = []


def register_agent_loop(make: Callable[[AgentEndpoint], Solver]) -> None:
    """Set how ``synth queries`` turns ``--agent-*`` options into a solver (idempotent)."""
    _AGENT_LOOPS[:] = [make]


def endpoint_solver(endpoint: AgentEndpoint) -> Solver:
    """The registered agent loop on ``endpoint``; a typed error when none is registered."""
    if not _AGENT_LOOPS:
        raise SynthesisError("no agent loop is registered to solve the written requests: run "
                             "`envfarm synth queries` (it registers the trainer's)")
    return _AGENT_LOOPS[0](endpoint)
