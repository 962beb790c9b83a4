"""A lease's handle on its instance in a worker, as the front holds it.

The handle serializes the lease's requests (its lock), keeps the lease's committed state (the
database as of its last completed call, ``CommittedState``) and outlives the worker: when the
worker is lost, the lease continues on another worker from that state, unless its own request
was the one at fault. What decides that (``docs/tenancy.md``):

- a request whose answer broke the rules (over its cap, malformed) is ``GUILTY``: its lease
  is lost, typed; the other requests in flight then are innocent and sent again elsewhere;
- a crash or a missed deadline names nobody: each request in flight then is ``SUSPECT`` and is
  sent again alone on a fresh worker (``WorkerEnv.quarantine``), one at a time, from its lease's
  committed state; one that kills that worker too is the guilty one;
- a lease with no request in flight loses nothing: its next request moves it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from envfarm.errors import EnvLoadError
from envfarm.models import CallResult, ToolSpec
from envfarm.worker import _frames
from envfarm.worker._committed import CommittedState, Template
from envfarm.worker._process import ANSWERED, GUILTY, SUSPECT, WorkerLost, WorkerProcess

if TYPE_CHECKING:
    from envfarm.worker._env import WorkerEnv

#: A lease moved this many times in a row without a request of it completing (workers lost
#: under it with no fault of its own) is given up: an env whose every worker dies soon after
#: it starts would otherwise churn workers forever.
MAX_MOVES = 8
#: What a reply may carry: a call's answer, then a delta of at most the whole database.
_DELTA_CAP = _frames.MAX_DB_BYTES + (1 << 20)
_CALL_CAP = _frames.MAX_RESULT_BYTES + _DELTA_CAP
_SQLITE_MAGIC = b"SQLite format 3\x00"


class InstanceClosed(Exception):
    """The lease gave its instance back while this request waited for its turn."""


class RemoteInstance:
    """A lease's instance, living in a worker; requests on it run one at a time."""

    __slots__ = ("env", "worker", "inst", "tenant", "initial", "task", "state", "closed",
                 "moves", "_lost", "_lock")

    def __init__(self, env: WorkerEnv, worker: WorkerProcess, inst: int, tenant: str,
                 initial: Template | None = None, task: int | None = None) -> None:
        self.env = env
        self.worker = worker
        self.inst = inst
        self.tenant = tenant
        #: What resets go back to and verifiers compare with: the env's template, or the
        #: starting database of ``task`` (EnvFactory's per-scenario state).
        self.initial = env.template if initial is None else initial
        self.task = task
        self.state = CommittedState(self.initial)
        self.closed = False  # released: no request of it is sent any more
        self.moves = 0
        self._lost: str | None = None
        # Queued behind this lease's own requests in the front, not in the worker: the deadline
        # starts when the worker starts the call, so one lease's burst cannot kill the worker;
        # and release waits for the request in flight (its drop never overtakes a call).
        self._lock = asyncio.Lock()

    @property
    def tools(self) -> list[ToolSpec]:
        return self.env.tools

    @property
    def lost(self) -> str | None:
        """Why this lease's state is gone (None while it lives, moved or not)."""
        return self._lost

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def initial_snapshot(self) -> bytes:
        return self.initial.data

    # -- requests ---------------------------------------------------------------------------
    async def call(self, tool: str, arguments: Any) -> CallResult:
        async with self._lock:
            reply, payload = await self._ask(
                {"op": "call", "tool": tool, "args": arguments}, self.env.call_deadline_s,
                cap=_CALL_CAP, answer_cap=_frames.MAX_RESULT_BYTES)
            answer = reply.get("rlen", len(payload))
            try:
                result = CallResult.model_validate_json(payload[:answer])
            except ValidationError:
                raise self._guilty("sent a malformed call result") from None
            try:
                self._commit(payload[answer:])
            except _frames.FrameError as exc:
                raise self._guilty(str(exc)) from None
            return result

    async def reset(self) -> None:
        async with self._lock:
            await self._ask({"op": "reset"}, self._grace_s)
            self.env.keep(self.worker, -self.state.own)
            self.state.reset()

    async def snapshot(self) -> bytes:
        """The database as of the last completed call: the front's copy (no worker asked)."""
        async with self._lock:
            self._check_open()
            return self.state.image()

    async def restore(self, data: bytes) -> None:
        """Take another instance's state (a fork through the front); ``EnvLoadError`` if the
        worker cannot read it (the instance stays as it was)."""
        if not data.startswith(_SQLITE_MAGIC):
            raise EnvLoadError(f"env {self.env.name!r}: not a database image", env=self.env.name)
        async with self._lock:
            reply, _ = await self._ask({"op": "restore"}, self._grace_s, payload=data)
            self._restored(reply)
            state = CommittedState(self.initial)
            state.load(data)
            self._take(state)

    async def copy_from(self, other: RemoteInstance) -> None:
        """Take ``other``'s state now (a fork): inside the worker when both live in the same one
        (no database crosses the channel, only what differs from the front's copy), else
        through the front."""
        async with other._lock:  # after the parent's calls already sent, before its next
            other._check_open()
            if other.worker is not self.worker or self.worker.lost is not None:
                image = other.state.image()
            else:
                async with self._lock:
                    reply, delta = await self._ask({"op": "clone", "src": other.inst},
                                                   self._grace_s, cap=_DELTA_CAP, answer_cap=0)
                    self._restored(reply)
                    state = other.state.copy()
                    try:
                        if delta:
                            state.apply(delta)
                    except _frames.FrameError as exc:
                        raise self._guilty(str(exc)) from None
                    self._take(state)
                return
        await self.restore(image)

    @property
    def _grace_s(self) -> float:
        return self.env.options.deadline_grace_s + 5

    def _restored(self, reply: dict[str, Any]) -> None:
        if not reply.get("restored"):
            raise EnvLoadError(f"env {self.env.name!r}: the worker could not restore the "
                               f"state ({str(reply.get('error'))[:200]})", env=self.env.name)

    def _take(self, state: CommittedState) -> None:
        self.env.keep(self.worker, state.own - self.state.own)
        self.state = state

    def _commit(self, delta: bytes) -> None:
        if delta:
            grown = self.state.apply(delta)
            if not self.env.keep(self.worker, grown):
                raise _frames.FrameError(
                    f"its leases' state passed the worker's byte budget of "
                    f"{self.env.options.kept_bytes_per_worker} bytes (instance {self.inst})")

    def _guilty(self, why: str) -> WorkerLost:
        """This lease's own answer broke the rules: the worker is killed (the other requests
        in flight there are innocent) and this lease is lost."""
        self.worker.kill(why, guilty=ANSWERED)
        return self._give_up(self.worker.lost or why)

    def _check_open(self) -> None:
        if self.closed:
            raise InstanceClosed("the lease was closed while this request waited")
        if self._lost is not None:
            raise WorkerLost(self._lost, GUILTY)

    async def _ask(self, header: dict[str, Any], timeout_s: float, *, cap: int = 0,
                   answer_cap: int | None = None, payload: bytes = b""
                   ) -> tuple[dict[str, Any], bytes]:
        """Send a request (the lock held) and return its reply, moving the lease off a lost
        worker as needed; WorkerLost once the lease itself is lost."""
        suspect = False
        while True:
            self._check_open()
            if suspect:  # in flight when the worker was lost: again, alone on a fresh one
                async with self.env.quarantine(self.tenant) as ward:
                    await self._move(ward)
                    try:
                        return await self._request(header, timeout_s, cap, answer_cap,
                                                   payload)
                    except WorkerLost as exc:
                        raise self._give_up(f"{exc.reason} (its request failed again alone on "
                                            "a fresh worker)") from None
            if self.worker.lost is not None:
                await self._move()
            try:
                return await self._request(header, timeout_s, cap, answer_cap, payload)
            except WorkerLost as exc:
                if exc.verdict == GUILTY:
                    raise self._give_up(exc.reason) from None
                suspect = exc.verdict == SUSPECT

    async def _request(self, header: dict[str, Any], timeout_s: float, cap: int,
                       answer_cap: int | None, payload: bytes = b""
                       ) -> tuple[dict[str, Any], bytes]:
        worker = self.worker
        reply, payload = await worker.request(dict(header, inst=self.inst), timeout_s, payload,
                                              cap=cap, answer_cap=answer_cap)
        if not reply.get("ok"):  # it cannot serve an instance the front placed there
            worker.kill(f"could not serve instance {self.inst}: {str(reply.get('error'))[:300]}")
            raise WorkerLost(worker.lost or "killed")
        self.moves = 0
        return reply, payload

    async def _move(self, ward: WorkerProcess | None = None) -> None:
        """Put this lease on another worker (``ward``, or wherever it has room), from its
        committed state."""
        why = self.worker.lost or "its worker was lost"
        if self.moves >= MAX_MOVES:
            raise self._give_up(f"{why}; its worker was lost {self.moves} times already")
        worker = await self.env.place(self.tenant, ward)  # PoolExhausted (503): try again later
        self.env.unplace(self)
        self.worker, self.inst = worker, self.env.new_inst()
        self.moves += 1
        self.env.placed(self)
        image = self.state.image() if self.state.pages is not None else b""
        worker.post({"op": "new", "inst": self.inst,
                     **({} if self.task is None else {"task": self.task})}, image)

    def _give_up(self, why: str) -> WorkerLost:
        self._lost = why
        return WorkerLost(why, GUILTY)

    # -- release ----------------------------------------------------------------------------
    def close(self) -> asyncio.Task | None:
        """The lease is closed: requests that wait for their turn are refused; the worker
        drops the instance after the request in flight (a task then, else at once)."""
        self.closed = True
        if not self._lock.locked():
            self.env.dropped(self)
            return None
        try:
            return asyncio.get_running_loop().create_task(self._drop_after_request())
        except RuntimeError:  # no loop (sync shutdown paths): nothing is in flight
            self.env.dropped(self)
            return None

    async def _drop_after_request(self) -> None:
        async with self._lock:
            self.env.dropped(self)
