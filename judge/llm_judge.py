"""The code-augmented LLM judge: task + trajectory + verifier output + criteria → a class.

The prompt is ours; AWM's judge is the reference for what goes in and for the priority order
(an environment fault first, then whether the database shows the task done). The answer must
be one JSON object; a malformed one gets one repair round, then it is a ``judge_error``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from envfarm.errors import LLMError
from envfarm.models import Criteria
from envfarm.verdict import Outcome, Verdict
from judge.sandbox import VerifierResult
from judge.trajectory import Trajectory, parse_turn

STAGE = "judge"

Classification = Literal["Completed", "Partially Completed", "Agent Error", "Environment Error"]

_OUTCOMES: dict[str, Outcome] = {
    "Completed": Outcome.completed,
    "Partially Completed": Outcome.partially_completed,
    "Agent Error": Outcome.agent_error,
    "Environment Error": Outcome.environment_error,
}

SYSTEM_PROMPT = """You grade one episode of an AI agent that used tools of a simulated \
application backed by a SQLite database.

You get: the user's task; the agent's trajectory (its tool calls and the tool results); the \
output of a verification function that compared the database before and after the episode; \
and, when available, the criteria that say how to read that output.

Decide, in this order of priority:
1. Environment Error - the application itself failed (server errors, crashes, broken tools, \
missing data the task presupposes) and that, not the agent, kept the task from being done.
2. Completed - the verification output and the trajectory show every requirement of the task \
met (the database ended in the state the task asks for; a requested answer was given).
3. Partially Completed - some but not all requirements are met, or the right change was made \
with a minor deviation.
4. Agent Error - otherwise: wrong, missing or harmful actions by the agent.

Trust the database evidence over the agent's claims. Answer with ONE JSON object and nothing \
else:
{"classification": "Completed" | "Partially Completed" | "Agent Error" | "Environment Error", \
"reasoning": "<why, in a few sentences>", "confidence": <number from 0 to 1>, \
"evidence": ["<short facts from the verifier output or trajectory>", ...]}"""

REPAIR_PROMPT = """Your previous answer could not be used: {error}

Answer again with ONLY the JSON object, exactly in this shape:
{{"classification": "Completed" | "Partially Completed" | "Agent Error" | "Environment Error", \
"reasoning": "...", "confidence": 0.0-1.0, "evidence": ["..."]}}"""


class LLMVerdict(BaseModel):
    """What the judge model must answer."""

    model_config = ConfigDict(extra="ignore")

    classification: Classification = Field(description="one of the four classes")
    reasoning: str = Field(description="why")
    confidence: float = Field(ge=0, le=1, description="0..1")
    evidence: list[str] = Field(default_factory=list, description="facts relied on")

    @field_validator("classification", mode="before")
    @classmethod
    def _normalize(cls, value: Any) -> Any:
        if isinstance(value, str):
            key = re.sub(r"[\s_\-]+", " ", value).strip().lower()
            for name in _OUTCOMES:
                if key == name.lower():
                    return name
        return value

    @field_validator("evidence", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            return [v if isinstance(v, str) else json.dumps(v) for v in value]
        return value


class AnswerParseError(ValueError):
    """The judge model's answer is not the JSON object asked for."""


def parse_answer(text: str) -> LLMVerdict:
    """Strictly parse a judge answer: one JSON object (code fences tolerated)."""
    body = text.strip()
    fence = re.match(r"^```(?:json)?\s*(.*?)\s*```$", body, re.DOTALL)
    if fence:
        body = fence.group(1)
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end < start:
        raise AnswerParseError("no JSON object in the answer")
    try:
        data = json.loads(body[start:end + 1])
    except ValueError as exc:
        raise AnswerParseError(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AnswerParseError("the answer is not a JSON object")
    try:
        return LLMVerdict.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "answer"
        raise AnswerParseError(f"{where}: {first['msg']}") from None


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit // 2] + "\n…[truncated]…\n" + text[-limit // 2:]


def render_trajectory(trajectory: Trajectory, limit: int = 24_000,
                      tool_limit: int = 2_000) -> str:
    """A compact, readable transcript: calls and results, reasoning dropped."""
    lines: list[str] = []
    for msg in trajectory.messages:
        if msg.role == "assistant":
            turn = parse_turn(msg)
            for call in turn.calls:
                lines.append(f"AGENT CALLS {call.name} {json.dumps(call.arguments)[:tool_limit]}")
            if turn.text:
                lines.append(f"AGENT SAYS {_clip(turn.text, tool_limit)}")
        elif msg.role == "tool":
            lines.append(f"TOOL RESULT {_clip(msg.content or '', tool_limit)}")
        elif msg.role == "user" and msg.content and msg.content != trajectory.task:
            lines.append(f"USER {_clip(msg.content, tool_limit)}")
    return _clip("\n".join(lines), limit)


def build_messages(task: str, verifier: VerifierResult, criteria: Criteria,
                   trajectory: Trajectory | None, final_answer: str | None,
                   max_chars: int = 24_000) -> list[dict[str, str]]:
    parts = [f"## Task\n{task}"]
    if trajectory is not None:
        parts.append(f"## Trajectory\n{render_trajectory(trajectory, max_chars)}")
    if final_answer:
        parts.append(f"## Agent's final answer\n{_clip(final_answer, 4_000)}")
    parts.append("## Verification output (" + verifier.mode + " mode)\n"
                 + _clip(json.dumps(verifier.result, indent=1, ensure_ascii=False), max_chars))
    if criteria.success_criteria:
        parts.append(f"## Success criteria\n{criteria.success_criteria}")
    if criteria.failure_criteria:
        parts.append(f"## Failure criteria\n{criteria.failure_criteria}")
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "\n\n".join(parts)}]


class LLMJudge:
    """Asks an LLM to classify an episode; never raises for a bad answer or a dead endpoint."""

    def __init__(self, client: Any, *, repair_attempts: int = 1, max_chars: int = 24_000,
                 temperature: float = 0.0) -> None:
        self.client = client  # envfarm.llm.LLMClient or anything with its async ``chat``
        self.repair_attempts = repair_attempts
        self.max_chars = max_chars
        self.temperature = temperature

    async def classify(self, task: str, verifier: VerifierResult, criteria: Criteria,
                       trajectory: Trajectory | None = None, final_answer: str | None = None,
                       scenario: str | None = None) -> Verdict:
        messages = build_messages(task, verifier, criteria, trajectory, final_answer,
                                  self.max_chars)
        errors: list[str] = []
        for attempt in range(self.repair_attempts + 1):
            try:
                res = await self.client.chat(messages, stage=STAGE, scenario=scenario,
                                             temperature=self.temperature,
                                             salt=f"repair-{attempt}" if attempt else None)
            except LLMError as exc:
                return Verdict.of(Outcome.invalid, f"judge_error: {exc.message}",
                                  error_kind="judge_error",
                                  details={"verifier": verifier.result, "attempts": errors})
            try:
                answer = parse_answer(res.text)
            except AnswerParseError as exc:
                errors.append(str(exc))
                messages = [*messages, {"role": "assistant", "content": res.text},
                            {"role": "user", "content": REPAIR_PROMPT.format(error=exc)}]
                continue
            outcome = _OUTCOMES[answer.classification]
            fields: dict[str, Any] = {"confidence": answer.confidence, "details": {
                "judge": "llm", "classification": answer.classification,
                "reasoning": answer.reasoning, "evidence": answer.evidence,
                "verifier": verifier.result, "repairs": len(errors)}}
            if outcome is Outcome.environment_error:
                fields["error_kind"] = "env_error"
            return Verdict.of(outcome, answer.reasoning[:500], **fields)
        return Verdict.of(Outcome.invalid,
                          f"judge_error: unparseable judge answer ({errors[-1]})",
                          error_kind="judge_error",
                          details={"verifier": verifier.result, "attempts": errors})
