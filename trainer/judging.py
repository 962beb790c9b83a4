"""Judge rewards for training (the ``llm`` reward path), judged while rollouts go on.

On the ``code`` path an episode ends with the farm's verify (the task's code-mode verifier
decides). On the ``llm`` path, the paper's: when an episode ends, the trainer takes the lease's
final database (and, once per env, the initial one), releases the lease and hands the episode
to the judge: the task's sql-mode verifier runs on the two databases in the judge's sandbox and
its output, with the trajectory and the criteria, goes to an LLM judge over any
OpenAI-compatible endpoint. The episode's rollout slot is free as soon as the databases are
taken, so the rest of the step's rollouts are collected while earlier episodes are judged; the
step waits for the last verdicts only before its update (``settle``).

The judge is a judge service (``judge_url``: ``POST /judge`` of ``judge.http`` or the Serve
deployment ``judge.service``) or a ``judge.Judge`` in this process. Anything that keeps an
episode from being judged (the service down, a bad answer) makes it invalid, never 0.0.

Where this differs from the paper: AWM judges one step's episodes while the *next* step's
rollouts are collected, so each update uses rewards of rollouts one policy version old. Here
judging overlaps the rollouts of the *same* step (episodes finish at different times), so
updates stay on-policy; what is not hidden is the judging of the last episodes to finish.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import ValidationError

from envfarm.catalog import Catalog
from envfarm.client import Lease
from envfarm.verdict import Outcome, RewardConfig, Verdict
from judge import (
    Judge,
    JudgeConfig,
    JudgeRequest,
    JudgeResponse,
    Trajectory,
    VerifierCode,
)

__all__ = ["EpisodeJudge", "from_config", "settle", "shared_judge"]

#: Starting databases an ``EpisodeJudge`` keeps (one per task in use; the oldest go first).
INITIAL_DBS = 256


class EpisodeJudge:
    """Sends finished episodes to the judge; each ``submit`` returns a future verdict."""

    def __init__(self, catalog: Catalog, *, url: str | None = None, judge: Judge | None = None,
                 overlap: bool = True, timeout_s: float = 900.0,
                 max_in_flight: int = 1024) -> None:
        if (url is None) == (judge is None):
            raise ValueError("EpisodeJudge needs a judge service url or a judge, not both")
        self.catalog = catalog
        self.url = url.rstrip("/") if url else None
        self.judge = judge
        self.overlap = overlap  # False: hold episodes until settle (the no-overlap baseline)
        self._gate = asyncio.Semaphore(max_in_flight)
        self._http = httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(
            max_connections=min(max_in_flight, 256))) if url else None
        #: (env, task) -> its starting database, newest last (at most ``INITIAL_DBS``)
        self._initial: OrderedDict[tuple[str, int | None], asyncio.Future[bytes]] = OrderedDict()
        self._held: list[tuple[JudgeRequest, asyncio.Future[Verdict]]] = []
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def create(cls, catalog: Catalog, reward: RewardConfig, url: str | None = None,
               **kwargs: Any) -> EpisodeJudge:
        """The judge service at ``url``, else an in-process judge on ``reward``'s endpoint."""
        if url:
            return cls(catalog, url=url, **kwargs)
        judge = Judge.from_env(JudgeConfig(use_llm="always"), **reward.llm_overrides())
        return cls(catalog, judge=judge, **kwargs)

    async def submit(self, lease: Lease, env: str, task_idx: int | None,
                     trajectory: Trajectory, final_answer: str | None) -> asyncio.Future[Verdict]:
        """Take the databases while the lease is ours; the verdict comes later."""
        final = await lease.snapshot()
        initial = await self._initial_db(lease, env, task_idx)
        return self.submit_request(
            self.request(env, task_idx, trajectory, final_answer, initial, final))

    def submit_request(self, request: JudgeRequest) -> asyncio.Future[Verdict]:
        """Judge a ready request: now (overlap) or at ``settle`` (the baseline)."""
        if not self.overlap:
            future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
            self._held.append((request, future))
            return future
        return asyncio.ensure_future(self._judge(request))

    def request(self, env: str, task_idx: int | None, trajectory: Trajectory,
                final_answer: str | None, initial: bytes, final: bytes) -> JudgeRequest:
        """The judge request of an episode: the sql-mode verifier when the task has one (the
        paper's judge reads its facts), else the code-mode one (which decides alone)."""
        bundle = self.catalog[env]
        sql = bundle.verifiers.get(task_idx) if task_idx is not None else None
        code = bundle.code_verifiers.get(task_idx) if task_idx is not None else None
        verifier = (VerifierCode(code=sql.code, raw_response=sql.raw_response, mode="sql") if sql
                    else VerifierCode(code=code.code, raw_response=code.raw_response or None,
                                      mode="code") if code else None)
        task = (bundle.tasks[task_idx] if task_idx is not None and task_idx < len(bundle.tasks)
                else trajectory.task)
        return JudgeRequest(id=f"{env}:{task_idx}:{next(self._ids)}", task=task,
                            trajectory=trajectory, verifier=verifier, final_answer=final_answer,
                            initial_db_b64=initial, final_db_b64=final, scenario=env,
                            task_idx=task_idx)

    async def _initial_db(self, lease: Lease, env: str, task_idx: int | None) -> bytes:
        # A task may start from a database of its own (an EnvFactory chain's, a synthesized
        # task's), not the env's template: taken once per task (a GRPO group shares it), from
        # the lease. Keyed by env alone, every episode of such a task was judged against
        # another task's start, and the facts showed rows "changed" that the agent never saw.
        key = (env, task_idx)
        future = self._initial.get(key)
        if future is None:
            future = self._initial[key] = asyncio.ensure_future(lease.snapshot("initial"))
            while len(self._initial) > INITIAL_DBS:
                self._initial.popitem(last=False)
        else:
            self._initial.move_to_end(key)
        try:
            return await asyncio.shield(future)
        except Exception:
            self._initial.pop(key, None)  # the next episode tries again
            raise

    async def _judge(self, request: JudgeRequest) -> Verdict:
        async with self._gate:
            if self.judge is not None:
                return (await self.judge.judge_many([request]))[0]
            assert self._http is not None
            try:
                reply = await self._http.post(f"{self.url}/judge",
                                              content=request.model_dump_json(),
                                              headers={"content-type": "application/json"})
                reply.raise_for_status()
                return JudgeResponse.model_validate_json(reply.content).verdict
            except (httpx.HTTPError, ValidationError) as exc:
                return Verdict.of(Outcome.invalid, f"judge_error: the judge service at "
                                  f"{self.url} failed: {type(exc).__name__}: {exc}"[:500],
                                  error_kind="judge_error")

    def start_held(self) -> None:
        """Judge the episodes held back (``overlap=False``), all at once."""
        held, self._held = self._held, []
        for request, future in held:
            task = asyncio.ensure_future(self._into(request, future))
            self._tasks.add(task)  # a reference, so the task is not collected mid-way
            task.add_done_callback(self._tasks.discard)

    async def _into(self, request: JudgeRequest, future: asyncio.Future[Verdict]) -> None:
        try:
            future.set_result(await self._judge(request))
        except Exception as exc:  # noqa: BLE001 - not swallowed: the waiter gets it
            future.set_exception(exc)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
        if self.judge is not None:
            await self.judge.aclose()


async def settle(episodes: Sequence[Any], judge: EpisodeJudge | None = None) -> None:
    """Wait for the verdicts of episodes still being judged and put them in place."""
    if judge is not None:
        judge.start_held()
    for episode in episodes:
        pending = getattr(episode, "pending", None)
        if pending is None:
            continue
        verdict: Verdict = await pending
        episode.pending = None
        episode.outcome, episode.reward, episode.valid = (verdict.outcome.value,
                                                          verdict.reward, verdict.valid)
        episode.reason = verdict.reason
        episode.details = {**episode.details, "verdict": verdict.details}


def from_config(config: Any, catalog: Catalog) -> EpisodeJudge | None:
    """The judge of a ``TrainConfig`` (None on the code path)."""
    if config.reward_path != "llm":
        return None
    reward = RewardConfig(path="llm", llm_base_url=config.judge_base_url,
                          llm_model=config.judge_model)
    return EpisodeJudge.create(catalog, reward, url=config.judge_url)


_SHARED: dict[tuple[str, int], EpisodeJudge] = {}


def shared_judge(url: str, catalog: Catalog) -> EpisodeJudge:
    """One client of a judge service per URL and event loop (the verl agent loop's episodes)."""
    key = (url, id(asyncio.get_running_loop()))
    if key not in _SHARED:
        _SHARED[key] = EpisodeJudge(catalog, url=url)
    return _SHARED[key]
