"""The judge, in process: format rules → sandboxed verifier → (LLM judge) → verdict + reward.

    async with Judge.from_env() as judge:          # code-only unless an LLM endpoint is set
        verdict = await judge.verify(code, initial_db, final_db, trajectory=traj)
        verdicts = await judge.judge_many([JudgeRequest(...), ...])
"""

from __future__ import annotations

import asyncio
import base64
import os
import zlib
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    model_validator,
)

from envfarm.errors import LLMError
from envfarm.models import Criteria, parse_raw_response
from envfarm.verdict import (
    COMPLETE,
    NOT_COMPLETE,
    EpisodeContext,
    Outcome,
    Verdict,
    code_result_outcome,
)
from judge._verifier_code import Mode
from judge.format_rules import check_format
from judge.llm_judge import LLMJudge
from judge.sandbox import DbInput, SandboxConfig, VerifierResult, VerifierSandbox
from judge.trajectory import Trajectory

#: Largest database a request may carry once decompressed.
MAX_DB_BYTES = 512 << 20


def _from_b64(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    data = base64.b64decode(value, validate=True)
    if data[:1] != b"\x78":  # not zlib: the raw file (a SQLite file starts with "SQLite")
        return data
    inflate = zlib.decompressobj()
    try:
        out = inflate.decompress(data, MAX_DB_BYTES)
    except zlib.error as exc:
        raise ValueError(f"not a database, nor zlib-compressed one: {exc}") from None
    if inflate.unconsumed_tail:
        raise ValueError(f"a database over {MAX_DB_BYTES >> 20} MiB")
    return out


def _to_b64(data: bytes) -> str:
    # SQLite pages compress ~10x in ~1 ms (zlib level 1): a judge request for two 250 KB
    # databases shrinks from ~680 KB of JSON to ~70 KB, which is most of its cost to move.
    return base64.b64encode(zlib.compress(data, 1)).decode()


#: Raw bytes in Python; base64 of zlib-compressed bytes in JSON (raw base64 is read too).
DbBytes = Annotated[bytes, BeforeValidator(_from_b64),
                    PlainSerializer(_to_b64, return_type=str, when_used="json")]

class VerifierCode(BaseModel):
    """A task's verifier as AWM stores it."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="Python source defining the verifier function")
    raw_response: str | None = Field(default=None,
                                     description="AWM's raw_response: function name, criteria")
    mode: Mode | None = Field(default=None, description="code / sql; None = detect")
    function_name: str | None = Field(default=None, description="override the detected name")


class JudgeRequest(BaseModel):
    """One episode to judge (the ``POST /judge`` body and a line of ``envfarm judge`` input)."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, description="caller's id, echoed in the answer")
    task: str | None = Field(default=None, description="the task (default: trajectory.task)")
    trajectory: Trajectory | None = Field(default=None, description="the agent's episode")
    verifier: VerifierCode | None = Field(default=None, description="the task's verifier")
    initial_db: str | None = Field(default=None, description="path of the initial database")
    final_db: str | None = Field(default=None, description="path of the final database")
    initial_db_b64: DbBytes | None = Field(
        default=None, description="the initial database (base64 of the file, or of its zlib "
                                  "compression, in JSON)")
    final_db_b64: DbBytes | None = Field(
        default=None, description="the final database (as initial_db_b64)")
    final_answer: str | None = Field(default=None,
                                     description="the agent's answer (default: from trajectory)")
    scenario: str | None = Field(default=None, description="AWM scenario name")
    task_idx: int | None = Field(default=None, description="task index in the scenario")

    @model_validator(mode="after")
    def _has_task(self) -> JudgeRequest:
        if self.task is None and self.trajectory is None:
            raise ValueError("a request needs `task` or `trajectory`")
        return self

    def databases(self) -> tuple[DbInput | None, DbInput | None]:
        return (self.initial_db_b64 if self.initial_db_b64 is not None else self.initial_db,
                self.final_db_b64 if self.final_db_b64 is not None else self.final_db)


class JudgeResponse(BaseModel):
    """One answer of ``POST /judge`` and one line of ``envfarm judge`` output."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, description="the request's id")
    verdict: Verdict = Field(description="outcome, reward, validity and why")


class JudgeConfig(BaseModel):
    """How the judge decides."""

    model_config = ConfigDict(extra="forbid")

    use_llm: Literal["auto", "always", "never"] = Field(
        default="auto", description="auto: the LLM judges sql-mode verifier output when an "
                                    "endpoint is configured (code mode always decides alone)")
    check_format: bool = Field(default=True, description="apply the six format rules first")
    repair_attempts: int = Field(default=1, ge=0, description="re-asks for an unparseable answer")
    max_chars: int = Field(default=24_000, ge=1000, description="prompt budget per section")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig,
                                   description="verifier sandbox limits")


def code_only_verdict(vr: VerifierResult) -> Verdict:
    """Decide from a verifier alone: code mode decides, sql mode needs the LLM (invalid here:
    its facts say nothing by themselves, and a guess would be a fake reward)."""
    if vr.mode == "sql":
        return Verdict.of(Outcome.invalid, "judge_error: sql-mode verifier output needs the LLM "
                          "judge, and none is configured", error_kind="judge_error",
                          details={"judge": "code", "verifier": vr.result})
    value = vr.result.get("result") if vr.result else None
    outcome = code_result_outcome(value)
    details = {"judge": "code", "verifier": vr.result}
    if outcome is Outcome.invalid:
        # None, "error", "verifier_failed: ...", a number: the verifier did not judge the agent.
        return Verdict.of(outcome, f"verifier_error: code verifier returned {value!r}, not "
                          f"{COMPLETE!r} or {NOT_COMPLETE!r}", error_kind="verifier_error",
                          details=details)
    return Verdict.of(outcome, f"code verifier returned {value!r}", details=details)


_SQLITE_HEADER = b"SQLite format 3\x00"


def _db_problem(db: DbInput) -> str | None:
    """Why ``db`` is not a SQLite database (bytes or a file), or None. Empty is a valid,
    empty database."""
    if isinstance(db, bytes):
        head = db[:16]
    else:
        try:
            with open(db, "rb") as fh:
                head = fh.read(16)
        except OSError as exc:
            return f"cannot be read: {exc.strerror or exc}"
    return None if not head or head == _SQLITE_HEADER else "is not a SQLite database"


def _internal_error(exc: BaseException) -> Verdict:
    # A bug of ours must not sink a whole batch, nor turn into a reward.
    if isinstance(exc, asyncio.CancelledError):
        raise exc
    return Verdict.of(Outcome.invalid, f"judge_error: {type(exc).__name__}: {exc}",
                      error_kind="judge_error")


class Judge:
    """Judges episodes in process; the Serve deployment wraps one of these."""

    def __init__(self, config: JudgeConfig | None = None, *, llm_client: Any = None,
                 sandbox: VerifierSandbox | None = None) -> None:
        self.config = config or JudgeConfig()
        if self.config.use_llm == "always" and llm_client is None:
            raise LLMError("the judge is set to always use an LLM, and none is configured")
        if self.config.use_llm == "never":
            llm_client = None
        self._llm_client = llm_client
        self.llm = (LLMJudge(llm_client, repair_attempts=self.config.repair_attempts,
                             max_chars=self.config.max_chars) if llm_client else None)
        self._own_sandbox = sandbox is None
        self.sandbox = sandbox or VerifierSandbox(**self.config.sandbox.model_dump())

    @classmethod
    def from_env(cls, config: JudgeConfig | None = None, **llm_overrides: Any) -> Judge:
        """An LLM judge when ``ENVFARM_LLM_BASE_URL`` (or an override) names an endpoint."""
        from envfarm.llm import ENV_BASE_URL, LLMClient, LLMConfig

        config = config or JudgeConfig()
        client = None
        if config.use_llm != "never" and (llm_overrides.get("base_url")
                                          or os.environ.get(ENV_BASE_URL)):
            llm_overrides.setdefault("max_concurrency", 256)
            client = LLMClient(LLMConfig.from_env(**llm_overrides))
        return cls(config, llm_client=client)

    @property
    def mode(self) -> str:
        return "llm" if self.llm else "code"

    async def verify(self, code: str | VerifierCode | None, initial_db: DbInput | None,
                     final_db: DbInput | None, *, task: str | None = None,
                     trajectory: Trajectory | None = None, final_answer: str | None = None,
                     raw_response: str | None = None, scenario: str | None = None,
                     context: EpisodeContext | None = None) -> Verdict:
        """Judge one episode from its parts (paths or bytes for the databases).

        As AWM runs it: a code-mode verifier decides by itself (``"complete"`` / ``"others"``);
        a sql-mode verifier's output goes to the LLM judge with the trajectory. ``context`` is
        what the farm passes: with an LLM configured, the task's sql-mode verifier (when it has
        one) replaces the code-mode ``code``."""
        verifier = VerifierCode(code=code, raw_response=raw_response) if isinstance(
            code, str) else code
        if context is not None:
            task = task if task is not None else context.task
            scenario = scenario or context.scenario
            if trajectory is None and context.trajectory is not None:
                try:
                    trajectory = Trajectory.model_validate(context.trajectory)
                except ValidationError as exc:
                    return Verdict.of(Outcome.invalid, "judge_error: the episode's trajectory "
                                      f"is not readable: {exc.errors()[0]['msg']}",
                                      error_kind="judge_error")
            if self.llm is not None and context.sql_code:
                verifier = VerifierCode(code=context.sql_code, mode="sql",
                                        raw_response=context.sql_raw_response)
        task = task if task is not None else (trajectory.task if trajectory else "")
        if final_answer is None and trajectory is not None:
            final_answer = trajectory.answer()
        if trajectory is not None and self.config.check_format:
            forced = check_format(trajectory).to_verdict()
            if forced is not None:
                return forced
        if verifier is None:
            return Verdict.of(Outcome.invalid, "verifier_error: the task has no verifier",
                              error_kind="verifier_error")
        if initial_db is None or final_db is None:
            return Verdict.of(Outcome.invalid, "verifier_error: both databases are needed",
                              error_kind="verifier_error")
        for which, db in (("initial", initial_db), ("final", final_db)):
            problem = _db_problem(db)
            if problem:  # a verifier that never opens it would still answer: not a verdict
                return Verdict.of(Outcome.invalid, f"verifier_error: the {which} database "
                                  f"{problem}", error_kind="verifier_error")
        vr = await self.sandbox.run(verifier.code, initial_db, final_db, final_answer,
                                    verifier.mode, function_name=verifier.function_name,
                                    raw_response=verifier.raw_response)
        if not vr.ok:
            return Verdict.of(Outcome.invalid, f"verifier_error: {vr.error}",
                              error_kind="verifier_error",
                              details={"verifier_error": vr.error,
                                       "verifier_error_kind": vr.error_kind, "mode": vr.mode})
        if self.llm is None or vr.mode == "code":
            return code_only_verdict(vr)
        criteria: Criteria = parse_raw_response(verifier.raw_response)
        return await self.llm.classify(task, vr, criteria, trajectory, final_answer,
                                       scenario=scenario, code=verifier.code)

    async def judge(self, request: JudgeRequest) -> Verdict:
        initial, final = request.databases()
        return await self.verify(request.verifier, initial, final, task=request.task,
                                 trajectory=request.trajectory, final_answer=request.final_answer,
                                 scenario=request.scenario)

    async def judge_many(self, requests: list[JudgeRequest]) -> list[Verdict]:
        """All at once: verifier runs share the pool, LLM calls overlap up to its limit."""
        results = await asyncio.gather(*(self.judge(r) for r in requests), return_exceptions=True)
        return [r if isinstance(r, Verdict) else _internal_error(r) for r in results]

    async def aclose(self) -> None:
        if self._own_sandbox:
            await asyncio.get_running_loop().run_in_executor(None, self.sandbox.close)
        if self._llm_client is not None and hasattr(self._llm_client, "aclose"):
            await self._llm_client.aclose()

    def close(self) -> None:
        """Close the sandbox (the LLM client's connections close with the loop)."""
        if self._own_sandbox:
            self.sandbox.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
