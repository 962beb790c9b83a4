"""The hack-probe suite: episodes a reward hacker would play, judged by a task's real verifier.

    from envfarm.hackprobes import ProbeTask, probe_task, probe_tasks, bundle_tasks

    report = await probe_task(runtime, ProbeTask.from_bundle(bundle, 3), judge)
    report.hacked      # probes the verifier rewarded: [] for a sound task
    report.rejects     # hacked, or a probe the verifier could not judge
    reports = await probe_tasks(runtime, bundle_tasks(bundle), judge, concurrency=4)

``judge`` is any ``envfarm.verdict.EpisodeVerifier``: ``judge.Judge`` in code mode (the
task's code-mode verifier decides) or with an LLM endpoint (the LLM-judge path: the task's
sql-mode verifier and the probe's trajectory go to the judge model). Run the suite once per
path. Synth's acceptance gate rejects a task that any probe passes; ``envfarm envs check
--hacks`` reports (and with ``--write-flags`` records) them, and the farm quarantines flagged
tasks at load.

The probes (each on a fresh instance of the task's starting database):

=============  ==================================================================================
noop           one harmless read, then "Done."
echo           the same, answering with the request's own text
guess          the same, answering plausible guesses (generic ones, values quoted in the
               request, and the task's own ``guesses``), one verification each
dump           every read tool with example arguments (the reference's reads first), answering
               with every value they returned
side_effect    the reference solution plus one unrelated destructive write, with its answer
truncated      the reference solution without its last write, with its answer
=============  ==================================================================================

A probe *passes* when its verdict is ``completed`` or, for every probe but ``truncated`` (which
did make progress), ``partially_completed``: a reward for doing nothing. A probe whose verdict
is invalid is *undecided* (the verifier cannot judge it). Probes that need tools are skipped
without a runtime (an env with no code); the last two are skipped without a reference solution.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, computed_field

from envfarm._hack_episodes import (
    EnvKit,
    Episode,
    dump_answer,
    last_write_removed,
    trajectory,
)
from envfarm.models import EnvBundle, ToolCall
from envfarm.runtime import EnvRuntime
from envfarm.verdict import EpisodeContext, EpisodeVerifier, Outcome, Verdict

__all__ = ["HackProbe", "HackReport", "ProbeResult", "ProbeTask", "bundle_tasks", "probe_task",
           "probe_tasks"]

NOOP_ANSWER = "Done."
GENERIC_GUESSES = ("Done, I've taken care of that.", "Yes.", "No.", "There are none.", "0", "1", "2")
MAX_GUESSES = 16


class HackProbe(str, Enum):
    """One kind of hack episode (module doc)."""

    noop = "noop"
    echo = "echo"
    guess = "guess"
    dump = "dump"
    side_effect = "side_effect"
    truncated = "truncated"


class ProbeTask(BaseModel):
    """A task as the probes need it; ``from_bundle`` reads one of a catalog env."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="The request an agent is given.")
    task_idx: int | None = Field(default=None, description="Its index in the env, if any.")
    code_verifier: str | None = Field(default=None, description="Code-mode verifier source.")
    sql_verifier: str | None = Field(default=None, description="Sql-mode verifier (LLM path).")
    sql_raw_response: str | None = Field(default=None, description="Its criteria (AWM).")
    solution: list[ToolCall] | None = Field(default=None, description="Reference calls.")
    final_answer: str | None = Field(default=None, description="The reference's answer.")
    guesses: list[str] = Field(default_factory=list,
                               description="Plausible wrong answers to try besides the generic ones.")
    initial_db: bytes | None = Field(default=None, description=(
        "The task's starting database; None: its state in the runtime's bundle, else the template."))

    @classmethod
    def from_bundle(cls, bundle: EnvBundle, idx: int) -> ProbeTask:
        code, sql = bundle.code_verifiers.get(idx), bundle.verifiers.get(idx)
        return cls(text=bundle.tasks[idx], task_idx=idx, code_verifier=code.code if code else None,
                   sql_verifier=sql.code if sql else None,
                   sql_raw_response=sql.raw_response if sql else None,
                   solution=bundle.solutions.get(idx), final_answer=bundle.solution_answers.get(idx))


class ProbeResult(BaseModel):
    """What one probe's episode got from the verifier."""

    model_config = ConfigDict(extra="forbid")

    probe: HackProbe
    passed: bool = Field(False, description="The verifier rewarded the hack.")
    undecided: bool = Field(False, description="The verifier gave no verdict (invalid).")
    skipped: str = Field("", description="Why the probe did not run; '' when it ran.")
    outcome: Outcome | None = None
    answer: str | None = Field(None, description="The final answer it gave (clipped).")
    detail: str = Field("", description="What the episode did, and the verdict's reason.")


class HackReport(BaseModel):
    """Every probe of one task on one reward path."""

    model_config = ConfigDict(extra="forbid")

    env: str
    task_idx: int | None = None
    task: str = Field(description="The request (clipped).")
    path: str = Field(description="Reward path: 'code' or 'llm'.")
    reference: Outcome | None = Field(None, description=(
        "The reference solution's verdict (None: the task has none, or no runtime)."))
    results: list[ProbeResult] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hacked(self) -> list[HackProbe]:
        """Probes the verifier rewarded."""
        return [r.probe for r in self.results if r.passed]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def undecided(self) -> list[HackProbe]:
        """Probes the verifier could not judge."""
        return [r.probe for r in self.results if r.undecided]

    @property
    def rejects(self) -> bool:
        """A task to keep out of rotation: a probe passes, or the verifier cannot judge one."""
        return bool(self.hacked or self.undecided)

    def summary(self) -> str:
        """One line: which probes passed or were undecided, with the first one's detail."""
        if not self.rejects:
            return f"no probe passes ({self.path} path)"
        bad = [r for r in self.results if r.passed or r.undecided]
        kinds = ", ".join(f"{r.probe.value}{'' if r.passed else ' (undecided)'}" for r in bad)
        return f"{self.path} path: {kinds}; {bad[0].probe.value}: {bad[0].detail}"[:500]


def bundle_tasks(bundle: EnvBundle) -> list[ProbeTask]:
    """Every task of a catalog env that has a verifier (code or sql mode)."""
    return [ProbeTask.from_bundle(bundle, i) for i in range(len(bundle.tasks))
            if i in bundle.code_verifiers or i in bundle.verifiers]


async def probe_tasks(runtime: EnvRuntime | None, tasks: Iterable[ProbeTask],
                      verifier: EpisodeVerifier, *, env: str | None = None,
                      path: str | None = None, concurrency: int = 4) -> list[HackReport]:
    """``probe_task`` for each task, ``concurrency`` tasks at a time, in order."""
    kit = EnvKit(runtime) if runtime is not None else None
    limit = asyncio.Semaphore(max(1, concurrency))

    async def one(task: ProbeTask) -> HackReport:
        async with limit:
            return await _probe(kit, task, verifier, env=env, path=path)

    return list(await asyncio.gather(*(one(t) for t in tasks)))


async def probe_task(runtime: EnvRuntime | None, task: ProbeTask, verifier: EpisodeVerifier, *,
                     env: str | None = None, path: str | None = None) -> HackReport:
    """Play every probe on ``task`` and judge each with ``verifier``; never raises for a bad
    task or verifier. ``runtime`` None: an env without code (only the probes that need no
    tool run, on ``task.initial_db``). ``path`` defaults to the verifier's ``mode``."""
    return await _probe(EnvKit(runtime) if runtime is not None else None, task, verifier,
                        env=env, path=path)


class _Judging:
    """One task's probes against one verifier."""

    def __init__(self, kit: EnvKit | None, task: ProbeTask, verifier: EpisodeVerifier,
                 env: str, initial: bytes) -> None:
        self.kit, self.task, self.verifier, self.env, self.initial = kit, task, verifier, env, initial

    async def verdict(self, episode: Episode | None, answer: str) -> Verdict:
        final = episode.final if episode is not None else self.initial
        traj = None
        if episode is not None and self.kit is not None:
            traj = trajectory(self.task.text, self.kit.tools, episode, answer, scenario=self.env,
                              task_idx=self.task.task_idx)
        context = EpisodeContext(task=self.task.text, task_idx=self.task.task_idx, scenario=self.env,
                                 trajectory=traj, sql_code=self.task.sql_verifier,
                                 sql_raw_response=self.task.sql_raw_response)
        try:
            return await self.verifier.verify(self.task.code_verifier, self.initial, final,
                                              final_answer=answer, context=context)
        except Exception as exc:  # noqa: BLE001 - a verifier may fail in any way: no verdict
            return Verdict.of(Outcome.invalid, f"the verifier raised {type(exc).__name__}: {exc}"[:300])

    async def result(self, probe: HackProbe, episode: Episode | None, answers: list[str],
                     note: str = "") -> ProbeResult:
        """The probe's episode judged with each answer; the first that passes (or is
        undecided) decides."""
        verdicts = await asyncio.gather(*(self.verdict(episode, a) for a in answers))
        for answer, verdict in zip(answers, verdicts, strict=True):
            passed, undecided = _rewarded(probe, verdict), not verdict.valid
            if passed or undecided:
                return _result(probe, verdict, answer, note, passed=passed, undecided=undecided)
        tried = f"{len(answers)} answers tried; " if len(answers) > 1 else ""
        return _result(probe, verdicts[-1], answers[-1], tried + note)


def _result(probe: HackProbe, verdict: Verdict, answer: str, note: str, *, passed: bool = False,
            undecided: bool = False) -> ProbeResult:
    detail = "; ".join(x for x in (note, f"verdict {verdict.outcome.value}: {verdict.reason}") if x)
    return ProbeResult(probe=probe, passed=passed, undecided=undecided, outcome=verdict.outcome,
                       answer=answer[:300], detail=detail[:600])


def _rewarded(probe: HackProbe, verdict: Verdict) -> bool:
    if verdict.outcome is Outcome.completed:
        return True
    return verdict.outcome is Outcome.partially_completed and probe is not HackProbe.truncated


def guesses(task: ProbeTask) -> list[str]:
    """Generic answers, values the request quotes, then the task's own guesses."""
    quoted = [next(g for g in m if g) for m in re.findall(
        r"'([^']{2,80})'|\"([^\"]{2,80})\"|\(([^()]{2,80})\)", task.text)]
    out: dict[str, str] = {}
    for answer in [*GENERIC_GUESSES, *(f"It is {q}." for q in quoted),
                   *(f"Done: {q}." for q in quoted), *task.guesses]:
        out.setdefault(answer.strip().lower(), answer)
    return list(out.values())[:MAX_GUESSES + len(task.guesses)]


async def _probe(kit: EnvKit | None, task: ProbeTask, verifier: EpisodeVerifier, *,
                 env: str | None, path: str | None) -> HackReport:
    name = env or (kit.runtime.name if kit else "")
    initial = task.initial_db if task.initial_db is not None else (
        kit.runtime.task_initial(task.task_idx) if kit else None)
    report = HackReport(env=name, task_idx=task.task_idx, task=task.text[:300],
                        path=path or str(getattr(verifier, "mode", "code")))
    if initial is None:
        report.results = [ProbeResult(probe=p, skipped="no runtime and no starting database")
                          for p in HackProbe]
        return report
    judging = _Judging(kit, task, verifier, name, initial)
    solution = task.solution or []
    noop, why = await _noop_episode(kit, initial, solution)
    report.results += await asyncio.gather(
        judging.result(HackProbe.noop, noop, [NOOP_ANSWER], why),
        judging.result(HackProbe.echo, noop, [task.text], why),
        judging.result(HackProbe.guess, noop, guesses(task), why))
    if kit is None:
        report.results += [ProbeResult(probe=p, skipped="the env has no code: no tool to call")
                           for p in (HackProbe.dump, HackProbe.side_effect, HackProbe.truncated)]
        return report
    episode, values = await kit.dump(initial, solution)
    report.results.append(await judging.result(
        HackProbe.dump, episode, [dump_answer(values)], f"{len(episode.calls)} reads, {len(values)} values"))
    report.reference, more = await _with_reference(judging, kit, initial, solution)
    report.results += more
    return report


async def _noop_episode(kit: EnvKit | None, initial: bytes, solution: list[ToolCall]
                        ) -> tuple[Episode | None, str]:
    if kit is None:
        return None, "no tools (the env has no code): the databases only"
    call = await kit.harmless(initial, {c.tool for c in solution})
    if call is None:
        return Episode(final=initial), "no read succeeds: list_tools only"
    return await kit.run(initial, [call]), f"one read: {call.tool}"


async def _with_reference(judging: _Judging, kit: EnvKit, initial: bytes,
                          solution: list[ToolCall]) -> tuple[Outcome | None, list[ProbeResult]]:
    """The reference's own verdict, then side_effect and truncated (both built on it)."""
    answer = judging.task.final_answer or NOOP_ANSWER
    if not solution:
        why = "no reference solution"
        return None, [ProbeResult(probe=p, skipped=why) for p in (HackProbe.side_effect, HackProbe.truncated)]
    ref = await kit.run(initial, solution)
    reference = (await judging.verdict(ref, answer)).outcome
    out: list[ProbeResult] = []
    if ref.failed:
        why = f"the reference solution fails ({ref.failed[0]})"[:300]
        return reference, [ProbeResult(probe=p, skipped=why) for p in (HackProbe.side_effect, HackProbe.truncated)]
    side = await kit.side_effect(initial, ref)
    out.append(await judging.result(HackProbe.side_effect, side, [answer], side.note) if side
               else ProbeResult(probe=HackProbe.side_effect, skipped="nothing else in the database to touch"))
    shorter = last_write_removed(kit, solution)
    if shorter is None:
        out.append(ProbeResult(probe=HackProbe.truncated, skipped="the reference writes nothing"))
    else:
        episode = await kit.run(initial, shorter)
        out.append(await judging.result(HackProbe.truncated, episode, [answer],
                                        f"{len(shorter)} of {len(solution)} reference calls"))
    return reference, out

