"""The acceptance gate: an agent solves the WRITTEN request through a farm.

A candidate episode (executed chain, templated verifier, written request) becomes a task of an
in-process farm built for the batch: the env's own tasks, then one task per candidate with its
verifier. For each candidate:

1. a no-op episode with a *plausible wrong answer* (values of the database that are not the
   expected ones, or "Done" for a change) is verified: a verifier that calls it complete is one
   an agent can pass by guessing, and the episode is dropped (``guessable``);
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envfarm.catalog import Catalog
from envfarm.client import ASGITransport, EnvfarmError, Farm
from envfarm.errors import SynthesisError
from envfarm.farm import FarmConfig, FarmCore, PoolConfig, build_app
from envfarm.models import EnvBundle, Verifier
from envfarm.runtime import EnvRuntime
from envfarm.verdict import Outcome, Verdict
from judge import Judge, JudgeConfig

DROP_GUESSABLE = "guessable"   # a no-op with a plausible wrong answer passes the verifier
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
    """One episode waiting for the gate: its farm task text, verifier and wrong answers."""

    task: str
    verifier_code: str
    wrong_answers: list[str]


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
            for i, c in enumerate(candidates)}}})
    core = FarmCore(FarmConfig(envs=[bundle.name], pool=PoolConfig(warm=2)),
                    catalog=Catalog({bundle.name: bundle}, [], Path(".")),
                    runtimes={bundle.name: EnvRuntime(bundle)}, verifier=lambda: _Borrowed(judge))
    app = build_app(core)
    async with app.router.lifespan_context(app), Farm("http://gate", transport=ASGITransport(app)) as farm:
        yield farm, first


def _passes(verdict: Verdict) -> bool:
    return verdict.outcome in (Outcome.completed, Outcome.partially_completed)


async def gate_one(farm: Farm, env: str, task_idx: int, candidate: Candidate, solver: Solver) -> GateResult:
    """The two checks of one candidate (module doc); never raises for a bad episode."""
    try:
        async with farm.lease(env, task_idx=task_idx) as lease:
            for answer in candidate.wrong_answers:
                verdict = await lease.verify(task_idx, answer)
                if _passes(verdict) or verdict.outcome is Outcome.invalid:
                    why = "passes" if _passes(verdict) else f"cannot judge ({verdict.reason})"
                    return GateResult(False, DROP_GUESSABLE,
                                      f"the verifier {why} a no-op answering {answer!r}"[:400])
        solved = await solver(farm, env, task_idx)
    except EnvfarmError as exc:
        return GateResult(False, DROP_SOLVER_ERROR, f"{type(exc).__name__}: {exc}"[:400])
    if not solved.valid:
        return GateResult(False, DROP_SOLVER_ERROR, solved.reason)
    if not solved.success:
        return GateResult(False, DROP_UNSOLVED, f"the agent following the request: {solved.reason}"[:400])
    return GateResult(True)


async def gate_batch(base: EnvBundle, candidates: list[Candidate], solver: Solver, judge: Judge, *,
                     concurrency: int = 4) -> list[GateResult]:
    """Gate every candidate on one farm built for the batch, ``concurrency`` at a time."""
    if not candidates:
        return []
    limit = asyncio.Semaphore(max(1, concurrency))
    async with gate_farm(base, candidates, judge) as (farm, first):
        async def one(i: int, c: Candidate) -> GateResult:
            async with limit:
                return await gate_one(farm, base.name, first + i, c, solver)

        return list(await asyncio.gather(*(one(i, c) for i, c in enumerate(candidates))))


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
