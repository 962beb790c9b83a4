"""Episode verification: which verdict a lease's episode gets, and the verifier that judges it.

The farm judges nothing itself: it is handed a verifier factory (``envfarm.compose`` hands in
the judge) and decides only when the verifier is not asked (no agent, a failing env).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from envfarm.errors import TaskNotFound
from envfarm.farm._lease import LeaseRecord
from envfarm.models import EnvBundle
from envfarm.verdict import EpisodeContext, EpisodeVerifier, Outcome, Verdict
from envfarm.wire import VerifyRequest

#: Makes the farm's verifier on the first verification (a verifier may start processes).
VerifierFactory = Callable[[], EpisodeVerifier]


async def episode_verdict(lease: LeaseRecord, bundle: EnvBundle, req: VerifyRequest,
                          final_db: Callable[[], Awaitable[bytes]],
                          verifier: LazyVerifier, gate: VerifyGate) -> tuple[int, Verdict]:
    """The task the episode is verified against and its verdict. ``final_db``: the lease's
    database now (the farm's snapshot, which closes a lease whose worker died). ``gate``:
    the verifier is asked in the lease's tenant's turn."""
    task_idx = req.task_idx if req.task_idx is not None else lease.task_idx
    if task_idx is None:
        raise TaskNotFound(f"lease {lease.lease_id} is bound to no task; pass task_idx",
                           lease_id=lease.lease_id)
    if task_idx >= len(bundle.tasks):
        raise TaskNotFound(f"env {lease.env!r} has {len(bundle.tasks)} tasks; no task_idx "
                           f"{task_idx}", env=lease.env, task_idx=task_idx)
    never = never_connected(lease)
    if never is not None:
        return task_idx, never
    if lease.env_errors:
        # The env failed the agent during this episode: no verdict on the agent (the
        # judge's rule 6), whatever the databases say.
        return task_idx, Verdict.of(Outcome.environment_error,
                                    f"env_error during the episode: {lease.env_errors[0]}",
                                    error_kind="env_error",
                                    details={"env_errors": list(lease.env_errors)})
    code = bundle.code_verifiers.get(task_idx)
    sql = bundle.verifiers.get(task_idx)  # what an llm-path judge reads instead
    context = EpisodeContext(
        task=bundle.tasks[task_idx], task_idx=task_idx, scenario=lease.env,
        trajectory=req.trajectory, sql_code=sql.code if sql else None,
        sql_raw_response=sql.raw_response if sql else None)
    async with gate.turn(lease.tenant):  # the databases are copied only once it is its turn
        initial, final = lease.instance.initial_snapshot(), await final_db()
        verdict = await (await verifier.get()).verify(
            code.code if code else None, initial, final,
            final_answer=req.final_answer, context=context)
    return task_idx, verdict


def never_connected(lease: LeaseRecord) -> Verdict | None:
    """An invalid verdict for a lease whose only traffic was refused (no or wrong credential):
    its agent never reached the env (a client that hid a 401), which says nothing about it."""
    if not lease.refused or lease.agent_requests:
        return None
    return Verdict.of(Outcome.invalid, f"the lease's agent never connected: all {lease.refused} "
                      "of its requests were refused (missing or wrong credential)",
                      error_kind="unauthorized", details={"refused_requests": lease.refused})


class VerifyGate:
    """At most ``slots`` verifications run at once in this process; beyond that they wait and
    tenants take turns (round robin), so a tenant's flood of verifications waits behind itself,
    never in front of another tenant's (the verifier sandbox behind it runs a few at a time)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.running = 0
        #: tenant -> its waiters, oldest first; the first tenant's turn is next
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @asynccontextmanager
    async def turn(self, tenant: str) -> AsyncIterator[None]:
        if self.running < self.slots and not self._waiting:
            self.running += 1
        else:
            await self._wait(tenant)
        try:
            yield
        finally:
            self._hand_on()

    async def _wait(self, tenant: str) -> None:
        """Until ``_hand_on`` gives this waiter a slot (counted in ``running`` already)."""
        waiter = asyncio.get_running_loop().create_future()
        queue = self._waiting.setdefault(tenant, deque())
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._hand_on()  # a slot was handed to it as it left: pass it on
            elif waiter in queue:
                queue.remove(waiter)
                if not queue and self._waiting.get(tenant) is queue:
                    del self._waiting[tenant]
            raise

    def _hand_on(self) -> None:
        """A slot is free: the next tenant in turn gets it, or it is given back."""
        while self._waiting:
            tenant, queue = next(iter(self._waiting.items()))
            waiter = queue.popleft()
            if queue:
                self._waiting.move_to_end(tenant)  # its next one waits for the others' turns
            else:
                del self._waiting[tenant]
            if not waiter.done():
                waiter.set_result(None)
                return
        self.running -= 1


class _NoVerifier:
    """The verifier of a farm composed without one: every verification is invalid."""

    async def verify(self, code: str | None, initial_db: bytes, final_db: bytes, *,
                     final_answer: str | None = None,
                     context: EpisodeContext | None = None) -> Verdict:
        return Verdict.of(Outcome.invalid, "verifier_error: this farm was started without a "
                          "verifier", error_kind="verifier_error")

    async def aclose(self) -> None:
        return None


class LazyVerifier:
    """Makes the verifier on the first verification, not at farm start-up (it may start
    worker processes, and most replicas of a busy farm never verify)."""

    def __init__(self, factory: VerifierFactory | None) -> None:
        self._factory = factory
        self._verifier: EpisodeVerifier | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> EpisodeVerifier:
        async with self._lock:
            if self._verifier is None:
                self._verifier = (await asyncio.to_thread(self._factory) if self._factory
                                  else _NoVerifier())
            return self._verifier

    async def aclose(self) -> None:
        if self._verifier is not None:
            await self._verifier.aclose()
            self._verifier = None
