"""The policy behind the agent loop: one small interface, several ways to answer it.

    class Policy(Protocol):
        async def generate(self, messages, ctx) -> Generation

``messages`` is exactly what the model sees this turn (already windowed); ``ctx`` says which
episode and turn it is. Implementations here: ``OpenAIPolicy`` (any OpenAI-compatible chat
endpoint: vLLM, SGLang, OpenAI, through the ``openai`` SDK) and ``ScriptedPolicy`` (replays the
task's reference solution: zero model cost, for throughput runs and as a guide in groups).
``trainer.hf.HFPolicy`` runs a local ``transformers`` causal LM and returns the token ids and
log-probabilities training needs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from judge import Message
from judge.trajectory import LIST_TOOLS
from trainer.format import call_tool_text, final_text, tool_call_text

FINISH_STOP, FINISH_LENGTH = "stop", "length"


@dataclass(frozen=True)
class TurnContext:
    """Which episode and turn a generation is for."""

    env: str
    task_idx: int | None
    task: str
    turn: int  # 0-based index of the assistant turn in the episode


@dataclass
class Generation:
    """One assistant turn as generated. Token fields are filled by local policies only."""

    text: str
    finish_reason: str = FINISH_STOP  # "length": cut by the token limit (never stopped)
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None  # of completion_ids under the sampling policy
    policy: str = ""  # who answered ("scripted" replays are not the model's own tokens)
    temperature: float | None = None  # a local policy's sampling temperature (0: greedy)
    extra: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """Anything that turns a (windowed) conversation into the next assistant turn."""

    async def generate(self, messages: Sequence[Message], ctx: TurnContext) -> Generation: ...


class PolicyError(Exception):
    """The policy itself failed (endpoint down, bad answer): not the agent's doing."""


class ScriptedPolicy:
    """Replays the reference solution of each task through the agent loop.

    Turn 0 lists the tools, turn i calls the solution's i-th tool, then a final answer. It needs
    no model and never reads the history, so it is exact under any window.
    """

    name = "scripted"

    def __init__(self, solutions: dict[tuple[str, int], list],
                 answers: dict[tuple[str, int], str] | None = None, *, brief: bool = False,
                 restate: bool = False, object_arguments: bool = False) -> None:
        self.solutions = solutions  # (env, task_idx) -> list[envfarm.ToolCall]
        self.answers = answers or {}  # (env, task_idx) -> stored reference final answer
        self.brief = brief  # two-word reasoning ("Step 2."): what a tiny model imitates cheaply
        # restate: a call's reasoning repeats the request's own "Step k: ..." sentence, so the
        # call that follows copies from the text just written (a tiny model copies nearby text
        # far more easily than it finds step k in the request); object_arguments: call_tool's
        # arguments as a JSON object, token for token what the request wrote (a string would
        # escape every quote)
        self.restate, self.object_arguments = restate, object_arguments

    @classmethod
    def from_catalog(cls, catalog, *, brief: bool = False, restate: bool = False,
                     object_arguments: bool = False) -> ScriptedPolicy:
        return cls({(name, idx): calls for name in catalog.names
                    for idx, calls in catalog[name].solutions.items()},
                   {(name, idx): answer for name in catalog.names
                    for idx, answer in catalog[name].solution_answers.items()}, brief=brief,
                   restate=restate, object_arguments=object_arguments)

    def has(self, env: str, task_idx: int | None) -> bool:
        return task_idx is not None and (env, task_idx) in self.solutions

    async def generate(self, messages: Sequence[Message], ctx: TurnContext) -> Generation:
        return Generation(text=self.turn_text(ctx), policy=self.name)

    def turn_text(self, ctx: TurnContext) -> str:
        """The reference turn ``ctx.turn`` of the task (what a perfect agent writes)."""
        if not self.has(ctx.env, ctx.task_idx):
            raise PolicyError(f"no reference solution for {ctx.env} task {ctx.task_idx}")
        calls = self.solutions[(ctx.env, ctx.task_idx)]
        if ctx.turn == 0:
            text = tool_call_text(LIST_TOOLS, {}, "Tools first." if self.brief else
                                  "First I list the tools I can use.")
        elif ctx.turn <= len(calls):
            call = calls[ctx.turn - 1]
            think = (f"Step {ctx.turn}." if self.brief else
                     f"Step {ctx.turn} of the plan: call {call.tool}.")
            if self.restate:
                think = request_step(ctx.task, ctx.turn) or think
            text = call_tool_text(call.tool, call.arguments, think, as_object=self.object_arguments)
        else:
            answer = self.answers.get((ctx.env, ctx.task_idx), "The task is done.")
            text = final_text(answer, "Done." if self.brief else "Every step succeeded; I can answer.")
        return text


def request_step(task: str, k: int) -> str | None:
    """The sentence ``Step k: ...`` of a numbered request (the template writer's), or None."""
    match = re.search(rf"(?:^|\s)(Step {k}: .*?)(?=\s+Step \d+: |\s*$)", task, re.S)
    return match.group(1) if match else None


class OpenAIPolicy:
    """A chat-completions endpoint through the ``openai`` SDK.

    Tool results are sent as user ``<tool_response>`` messages, which is what Qwen3's template
    makes of them anyway, and which endpoints accept without OpenAI's tool-call ids. Reasoning a
    server splits out (``reasoning_content``) is put back inside ``<think>``.
    """

    name = "openai"

    def __init__(self, base_url: str, model: str, *, api_key: str = "EMPTY",
                 temperature: float = 1.0, max_tokens: int = 1024, timeout_s: float = 120.0,
                 max_retries: int = 2) -> None:
        from openai import AsyncOpenAI

        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.client = AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s,
                                  max_retries=max_retries)

    async def generate(self, messages: Sequence[Message], ctx: TurnContext) -> Generation:
        import openai

        wire = [_to_openai(m) for m in messages]
        try:
            resp = await self.client.chat.completions.create(
                model=self.model, messages=wire, temperature=self.temperature,
                max_tokens=self.max_tokens)
        except openai.OpenAIError as exc:
            raise PolicyError(f"policy endpoint failed: {exc}") from exc
        if not resp.choices:
            raise PolicyError("policy endpoint answered no choices")
        choice = resp.choices[0]
        text = choice.message.content or ""
        reasoning = getattr(choice.message, "reasoning_content", None)
        if reasoning and "<think>" not in text:
            text = f"<think>\n{reasoning}\n</think>\n\n{text}"
        finish = FINISH_LENGTH if choice.finish_reason == "length" else FINISH_STOP
        usage = resp.usage
        extra = {"completion_tokens": usage.completion_tokens} if usage else {}
        return Generation(text=text, finish_reason=finish, policy=self.name, extra=extra)

    async def aclose(self) -> None:
        await self.client.close()


def _to_openai(msg: Message) -> dict[str, str]:
    if msg.role == "tool":
        return {"role": "user",
                "content": f"<tool_response>\n{msg.content or ''}\n</tool_response>"}
    return {"role": msg.role, "content": msg.content or ""}
