"""One episode of the agent loop against the farm: lease, turns, verdict, release.

    result = await run_episode(farm, policy, "hotel_booking_1", task_idx=0)
    result.reward, result.valid, result.end       # e.g. 1.0, True, EndReason.final_answer

Every way an episode can end is a typed ``EndReason`` and is counted by the trainer. The format
rules are the judge's (``judge.check_format``, applied after each turn so a violation ends the
episode early); the reward is the farm's verify path (the judge's one outcome -> reward table);
the lease is released however the episode ends, cancellation included.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from envfarm.client import EnvfarmError, Farm, Lease, LeaseLost
from judge import FormatChecker, FormatRule, Message, Outcome, ToolSchema, Trajectory, Verdict
from judge.trajectory import LIST_TOOLS
from trainer.format import TurnKind, parse_assistant, system_prompt, tool_content
from trainer.policy import FINISH_LENGTH, Generation, Policy, PolicyError, TurnContext
from trainer.window import DEFAULT_WINDOW, window


class EndReason(str, Enum):
    """How an episode ended (before it was judged)."""

    final_answer = "final_answer"    # a turn without a tool call
    turn_limit = "turn_limit"        # max_turns assistant turns, still calling tools
    format_error = "format_error"    # a rule of judge.check_format broken: reward -1.0
    too_long = "too_long"            # the turn hit the token/char limit (never stopped): -1.0
    env_error = "env_error"          # the environment failed (5xx, crash): invalid
    lease_lost = "lease_lost"        # 410 mid-episode: invalid, dropped from its group
    farm_error = "farm_error"        # the farm could not be reached / answered nonsense: invalid
    policy_error = "policy_error"    # the policy endpoint failed: invalid


#: Ends that say nothing about the agent: the rollout is dropped, never scored 0.
INVALID_ENDS = {EndReason.env_error, EndReason.lease_lost, EndReason.farm_error,
                EndReason.policy_error}


@dataclass
class EpisodeConfig:
    max_turns: int = 20
    window: int | None = DEFAULT_WINDOW
    max_turn_chars: int = 16_000   # a longer assistant turn is "too_long"
    max_tool_chars: int = 8_000    # a longer tool result is cut (kept valid JSON)
    tool_listing: str = "full"     # "compact": list_tools answers names, one-line
                                   # descriptions and argument lists (short prompts for
                                   # small models); "names": the names alone (tiny CPU
                                   # models); the schemas stay in the trajectory
    system: str = field(default_factory=system_prompt)
    judge: Any = None              # a trainer.judging.EpisodeJudge: the llm reward path
                                   # (None: the farm's verify, the code path)
    prompt_budget: Any = None      # a trainer.budget.PromptBudget: every prompt measured;
                                   # a listing that does not fit becomes names only


@dataclass
class TurnRecord:
    """What the policy saw (the windowed prompt) and what it wrote."""

    prompt: list[Message]
    generation: Generation


@dataclass
class EpisodeResult:
    env: str
    task_idx: int | None
    task: str
    end: EndReason
    outcome: str
    reward: float | None
    valid: bool
    reason: str
    trajectory: Trajectory
    turns: list[TurnRecord]
    lease_id: str | None = None
    env_calls: int = 0           # farm requests on the lease: list_tools, tool calls, verify
    seconds: float = 0.0
    env_seconds: float = 0.0     # time spent waiting on the farm
    policy_seconds: float = 0.0  # time spent waiting on the policy
    details: dict[str, Any] = field(default_factory=dict)
    pending: Any = None          # the verdict being judged (llm path): trainer.judging.settle

    @property
    def success(self) -> bool:
        return self.valid and self.reward == 1.0

    def summary(self) -> dict[str, Any]:
        """One JSON-able line for a rollouts file."""
        return {"env": self.env, "task_idx": self.task_idx, "end": self.end.value,
                "outcome": self.outcome, "reward": self.reward, "valid": self.valid,
                "success": self.success, "reason": self.reason, "turns": len(self.turns),
                "env_calls": self.env_calls, "seconds": round(self.seconds, 4),
                "env_seconds": round(self.env_seconds, 4), "lease_id": self.lease_id,
                "trajectory": self.trajectory.model_dump(mode="json", exclude_none=True)}


async def run_episode(farm: Farm, policy: Policy, env: str, task_idx: int | None = None, *,
                      lease: Lease | None = None,
                      config: EpisodeConfig | None = None) -> EpisodeResult:
    """Run one episode. A given ``lease`` (e.g. from a batched lease request) is taken over:
    it is released at the end like one acquired here."""
    return await _Episode(farm, policy, env, task_idx, config or EpisodeConfig()).run(lease)


async def run_prefix(farm: Farm, policy: Policy, env: str, task_idx: int | None, turns: int,
                     *, lease: Lease, config: EpisodeConfig | None = None) -> _Episode:
    """The first ``turns`` turns of an episode on ``lease``, not judged and not released: the
    returned episode is ``branch()``-ed, then each copy ``run(its lease, start=turns)``. If the
    episode ended (or failed) before ``turns``, ``reached`` is False and ``run`` judges that."""
    episode = _Episode(farm, policy, env, task_idx, config or EpisodeConfig())
    try:
        episode.begin(lease)
        episode.ended = await episode._turns(lease, 0, turns)
    except (_End, EnvfarmError) as exc:
        episode.stopped = exc
    return episode


class _End(Exception):
    def __init__(self, reason: EndReason, message: str, verdict: Verdict | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.verdict = verdict


class _Episode:
    def __init__(self, farm: Farm, policy: Policy, env: str, task_idx: int | None,
                 config: EpisodeConfig) -> None:
        self.farm, self.policy, self.env, self.task_idx, self.cfg = (farm, policy, env,
                                                                     task_idx, config)
        self.messages: list[Message] = []
        #: The judge's format rules, fed each message as it is added (checked after each turn).
        self.format = FormatChecker()
        self.turns: list[TurnRecord] = []
        self.tools: list[ToolSchema] = []
        self.task = ""
        self.final_answer: str | None = None
        self.env_calls = 0
        self.env_s = 0.0
        self.policy_s = 0.0
        self.pending: Any = None
        #: a prefix's end before its last turn (``run_prefix``): judged by ``run``
        self.ended: EndReason | None = None
        self.stopped: Exception | None = None

    @property
    def reached(self) -> bool:
        """A prefix ran all its turns (it can be branched)."""
        return self.ended is None and self.stopped is None

    def branch(self) -> _Episode:
        """A copy that goes on from here on its own (messages, checker and records copied)."""
        other = copy.copy(self)
        other.messages, other.turns = list(self.messages), list(self.turns)
        other.format = copy.deepcopy(self.format)
        return other

    def begin(self, lease: Lease) -> None:
        if self.task_idx is None:
            self.task_idx = lease.info.task_idx
        self.task = lease.info.task or ""
        self._add(Message(role="system", content=self.cfg.system))
        self._add(Message(role="user", content=self.task))

    async def run(self, lease: Lease | None, start: int = 0) -> EpisodeResult:
        """The episode from turn ``start`` (0: from the lease on) to its verdict; the lease is
        released however it ends."""
        started = time.perf_counter()
        verdict: Verdict | None = None
        try:
            try:
                if lease is None:
                    lease = await self._farm(self.farm.acquire(self.env, task_idx=self.task_idx))
                if self.stopped is not None:
                    raise self.stopped
                if start == 0:
                    self.begin(lease)
                end = self.ended or await self._turns(lease, start)
                verdict = await self._judge(lease, end)
            except _End as stop:
                end, verdict = stop.reason, stop.verdict or _verdict_for(stop.reason,
                                                                          stop.message)
            except LeaseLost as exc:
                end, verdict = EndReason.lease_lost, _verdict_for(EndReason.lease_lost, str(exc))
            except EnvfarmError as exc:
                end, verdict = EndReason.farm_error, _verdict_for(EndReason.farm_error,
                                                                  f"{type(exc).__name__}: {exc}")
        finally:
            if lease is not None:
                await _release(lease)
        return EpisodeResult(
            env=self.env, task_idx=self.task_idx, task=self.task, end=end,
            outcome=verdict.outcome.value, reward=verdict.reward, valid=verdict.valid,
            reason=verdict.reason, trajectory=self._trajectory(), turns=self.turns,
            lease_id=lease.lease_id if lease else None, env_calls=self.env_calls,
            seconds=time.perf_counter() - started, env_seconds=self.env_s,
            policy_seconds=self.policy_s, details=verdict.details, pending=self.pending)

    async def _farm(self, awaitable: Any) -> Any:
        t = time.perf_counter()
        try:
            return await awaitable
        finally:
            self.env_s += time.perf_counter() - t

    def _add(self, msg: Message) -> None:
        self.messages.append(msg)
        self.format.add(msg)

    def _trajectory(self) -> Trajectory:
        return Trajectory(task=self.task, messages=list(self.messages),
                          final_answer=self.final_answer, tools=self.tools, scenario=self.env,
                          task_idx=self.task_idx, max_turns=self.cfg.max_turns)

    async def _turns(self, lease: Lease, start: int = 0, stop: int | None = None
                     ) -> EndReason | None:
        """Turns ``start`` .. (``stop`` or the limit); None when it stopped at ``stop``."""
        last = self.cfg.max_turns if stop is None else min(stop, self.cfg.max_turns)
        for turn in range(start, last):
            prompt = window(self.messages, self.cfg.window)
            if self.cfg.prompt_budget is not None:  # never a prompt the server would cut
                self.cfg.prompt_budget.check(prompt, f"{self.env} task {self.task_idx} "
                                                     f"turn {turn}")
            ctx = TurnContext(env=self.env, task_idx=self.task_idx, task=self.task, turn=turn)
            t = time.perf_counter()
            try:
                gen = await self.policy.generate(prompt, ctx)
            except PolicyError as exc:
                raise _End(EndReason.policy_error, str(exc)) from None
            finally:
                self.policy_s += time.perf_counter() - t
            self.turns.append(TurnRecord(prompt=prompt, generation=gen))
            self._add(Message(role="assistant", content=gen.text))
            if gen.finish_reason == FINISH_LENGTH or len(gen.text) > self.cfg.max_turn_chars:
                raise _End(EndReason.too_long, f"turn {turn} hit the length limit "
                           f"({len(gen.text)} chars) without finishing")
            parsed = parse_assistant(gen.text)
            if parsed.kind is TurnKind.malformed:
                raise _End(EndReason.format_error, f"turn {turn}: {parsed.problem}")
            report = self.format.report()
            # "at least one successful call" is judged on the whole episode, not mid-way
            if not report.ok and report.rule is not FormatRule.successful_call:
                raise _End(EndReason.format_error, report.message, report.to_verdict())
            if parsed.kind is TurnKind.final:
                self.final_answer = parsed.text
                return EndReason.final_answer
            await self._execute(lease, parsed.call)
        return EndReason.turn_limit if last == self.cfg.max_turns else None

    async def _execute(self, lease: Lease, call: Any) -> None:
        self.env_calls += 1
        if call.name == LIST_TOOLS:
            specs = await self._farm(lease.tools())
            self.tools = [ToolSchema(name=s.name, description=s.description,
                                     input_schema=s.input_schema) for s in specs]
            self.format.tools = self.tools  # the trajectory's copy, as check_format sees it
            content = self._listing(self.cfg.tool_listing)
            budget = self.cfg.prompt_budget
            if budget is not None and self.cfg.tool_listing != "names":
                content = budget.choose_listing(
                    self.messages, content, lambda: self._listing("names"),
                    f"{self.env} task {self.task_idx} (list_tools, {len(self.tools)} tools)")
        else:  # call_tool; check_format has vetted name and arguments
            name = call.arguments["tool_name"]
            raw = call.arguments.get("arguments", "{}")
            args = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
            try:
                res = await self._farm(lease.call_result(name, args))
            except LeaseLost:
                raise
            except EnvfarmError as exc:
                if getattr(exc, "http_status", None) not in (413, 422):
                    raise
                # a request the farm refuses (too large, invalid): the agent's doing
                content = tool_content(False, error={"kind": "agent_error", "message": str(exc)})
            else:
                err = res.error.model_dump() if res.error else None
                content = tool_content(res.ok, res.result, err, res.status,
                                       max_chars=self.cfg.max_tool_chars)
                if not res.ok and res.error and res.error.kind == "env_error":
                    self._add(Message(role="tool", content=content))
                    raise _End(EndReason.env_error, f"{name}: {res.error.message}")
        self._add(Message(role="tool", content=content))

    def _listing(self, kind: str) -> str:
        """The ``list_tools`` answer: full schemas, compact lines, or the names alone."""
        listing = ([compact_tool(t) for t in self.tools] if kind == "compact" else
                   [t.name for t in self.tools] if kind == "names" else
                   # what model_dump() gives, without its deep copy of every schema
                   # (~8 ms of client CPU per episode over 38 tools)
                   [{"name": t.name, "description": t.description,
                     "input_schema": t.input_schema} for t in self.tools])
        return tool_content(True, listing, max_chars=1 << 30)  # never cut the list

    async def _judge(self, lease: Lease, end: EndReason) -> Verdict:
        report = self.format.report()
        verdict = report.to_verdict()
        if verdict is not None:  # e.g. rule 5 on the whole episode: no verify needed
            return verdict
        self.env_calls += 1
        if self.cfg.judge is not None:  # llm path: judged after the lease is given back
            self.pending = await self._farm(self.cfg.judge.submit(
                lease, self.env, self.task_idx, self._trajectory(), self.final_answer))
            return Verdict.of(Outcome.invalid, "being judged", error_kind="judge_pending",
                              details={"end": end.value})
        # the trajectory goes along: a farm on the llm reward path shows it to its judge
        res = await self._farm(lease.verify(self.task_idx, self.final_answer, self._trajectory()))
        return Verdict.of(Outcome(res.outcome), res.reason,
                          details={"verifier": res.details, "end": end.value})


def compact_tool(tool: ToolSchema) -> dict[str, str]:
    """A tool in a few dozen characters: name, first line of its description, its arguments."""
    props = tool.input_schema.get("properties") or {}
    required = set(tool.input_schema.get("required") or ())
    args = ", ".join(f"{name}: {spec.get('type', 'any') if isinstance(spec, dict) else 'any'}"
                     f"{'' if name in required else '?'}" for name, spec in props.items())
    line = (tool.description or "").strip().split("\n", 1)[0][:120]
    return {"name": tool.name, "description": line, "arguments": args}


def _verdict_for(reason: EndReason, message: str) -> Verdict:
    if reason in INVALID_ENDS:
        kind = "env_error" if reason is EndReason.env_error else reason.value
        outcome = Outcome.environment_error if reason is EndReason.env_error else Outcome.invalid
        return Verdict.of(outcome, message, error_kind=kind)
    return Verdict.of(Outcome.format_error, message)


async def _release(lease: Lease) -> None:
    """Give the lease back even when the episode's task is being cancelled."""
    try:
        await asyncio.shield(lease.release())
    except (EnvfarmError, asyncio.CancelledError):
        pass  # already gone, or we are cancelled: the shielded release still completes
