"""The verl plugin's half that needs no verl: the policy over verl's LLM servers, the episode
settings of the loop (with its prompt budget), and what the plugin hands verl for one episode.

``ServerPolicy`` turns our agent loop's turns into verl server calls; ``loop_episode_config``
measures every prompt against verl's ``rollout.prompt_length`` with the model's tokenizer
(``trainer.budget``: a tool listing that does not fit becomes names only, or the run fails
naming the budget; nothing is cut); ``turn_outputs`` returns the fields of verl's
``AgentLoopOutput`` (all but ``metrics``), one
dict per training sample; ``trainer.verl_plugin`` wraps them. Kept apart so the default test
suite (no verl: it is the ``gpu`` extra) checks them against verl 0.9.1's V1 bookkeeping,
which reads, for every output of an agent loop:

- ``extra_fields["min_global_steps"]`` / ``["max_global_steps"]``: the weight versions the
  sample was generated across. V1's ``_agent_loop_postprocess`` copies them into the sample's
  tags and its ``_compute_metrics`` runs ``np.array(..., dtype=int)`` over them every step, so
  a missing one (``None``) is a ``TypeError`` at step 1. verl's ``LLMServerClient.generate``
  puts them in ``TokenOutput.extra_fields``; ``ServerPolicy`` keeps that dict in
  ``Generation.extra`` and the turn's sample carries it. Turns no server wrote (a scripted
  replay) take the row's ``global_steps``.
- ``extra_fields["reward_extra_info"]`` of the last output (copied to the others).
- the last output's ``reward_score``: V1 computes GRPO advantages from each session's last
  output and broadcasts them to its other outputs.

Per-step credit (AWM Sec. 4.1, ``trainer.grpo.step_advantages``): a normally ended episode gives
every turn the outcome (V1's broadcast does exactly that); an episode ended by a format
violation gives its -1 to the violating turn only. Since V1 would broadcast the -1 to every
output of the session, only the violating turn is returned: the turns before it carry no
credit (advantage 0), which is what they would get.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from judge import Message, Outcome
from trainer.budget import PromptBudget
from trainer.episode import EpisodeConfig, EpisodeResult
from trainer.format import render
from trainer.policy import FINISH_LENGTH, FINISH_STOP, Generation, PolicyError, TurnContext

#: the extra_fields keys verl's V1 trainer reads from every output
VERSION_KEYS = ("min_global_steps", "max_global_steps")


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


# -- the policy over verl's LLM servers ------------------------------------------------------------------------------
class ServerPolicy:
    """Our ``Policy`` over verl's server manager (``LLMServerClient`` or anything with its
    ``generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput``: ``token_ids``,
    ``log_probs``, ``extra_fields``)."""

    name = "verl"

    def __init__(self, server_manager: Any, tokenizer: Any, sampling_params: dict[str, Any], *,
                 max_tokens: int, request_id: str | None = None) -> None:
        self.server = server_manager
        self.tokenizer = tokenizer
        self.sampling_params = dict(sampling_params)
        self.max_tokens = max_tokens
        self.request_id = request_id or uuid.uuid4().hex  # one per episode: sticky server
        self.eos_id = tokenizer.eos_token_id

    async def generate(self, messages: Sequence[Message], ctx: TurnContext) -> Generation:
        prompt_ids = encode(self.tokenizer, render(messages))
        params = {**self.sampling_params, "max_tokens": self.max_tokens}
        try:
            out = await self.server.generate(
                request_id=self.request_id, prompt_ids=prompt_ids, sampling_params=params)
        except Exception as exc:  # the server's failure is not the agent's: invalid rollout
            raise PolicyError(f"verl server failed: {type(exc).__name__}: {exc}") from exc
        ids = list(out.token_ids)
        stopped = bool(ids) and ids[-1] == self.eos_id
        finish = FINISH_STOP if stopped or len(ids) < self.max_tokens else FINISH_LENGTH
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        text = text.removesuffix(self.tokenizer.eos_token or "")
        # extra_fields carries the weight versions (min/max_global_steps) V1 tags samples with
        return Generation(text=text, finish_reason=finish, prompt_ids=prompt_ids,
                          completion_ids=ids, logprobs=out.log_probs, policy=self.name,
                          extra=dict(out.extra_fields or {}))


def loop_episode_config(tokenizer: Any, *, prompt_length: int, on_long_prompt: str = "names",
                        prompt_reserve: int | None = None, **episode: Any) -> EpisodeConfig:
    """The agent loop's episode settings: ``episode`` (max_turns, window, tool_listing,
    max_tool_chars) with every prompt measured against ``prompt_length`` tokens."""
    budget = PromptBudget.of_tokenizer(tokenizer, prompt_length, reserve=prompt_reserve,
                                       on_overflow=on_long_prompt)
    return EpisodeConfig(prompt_budget=budget, **episode)


def turn_tokens(tokenizer: Any, prompt: Sequence[Message], gen: Generation
                ) -> tuple[list[int], list[int], list[float] | None]:
    """A turn's training sample: the exact tokens a server policy saw and sampled; for a text
    policy (scripted, OpenAI), the rendered windowed prompt and the turn + end-of-turn token."""
    if gen.prompt_ids is not None and gen.completion_ids is not None:
        return list(gen.prompt_ids), list(gen.completion_ids), gen.logprobs
    prompt_ids = encode(tokenizer, render(prompt))
    response_ids = encode(tokenizer, gen.text) + [tokenizer.eos_token_id]
    return prompt_ids, response_ids, None


def weight_versions(gen: Generation, global_steps: int | None) -> dict[str, int]:
    """The model versions a turn was sampled across, as verl's server client reports them;
    the row's step where no server wrote the turn."""
    fallback = int(global_steps) if global_steps is not None else 0
    step = gen.extra.get("global_steps")
    out = {}
    for key in VERSION_KEYS:
        value = gen.extra.get(key, step)
        out[key] = int(value) if value is not None else fallback
    return out


def trained_turns(result: EpisodeResult) -> list[int]:
    """Which turns of an episode become samples: all of them, or only the violating last one
    when a format rule ended it (the others' credit is 0)."""
    n = len(result.turns)
    if result.outcome == Outcome.format_error.value:
        return [n - 1] if n else []
    return list(range(n))


def turn_outputs(result: EpisodeResult, tokenizer: Any, *, reward: float,
                 global_steps: int | None = None, seconds: float = 0.0
                 ) -> list[dict[str, Any]]:
    """``AgentLoopOutput`` fields (without ``metrics``) for the episode's trained turns."""
    info = {"outcome": result.outcome, "end": result.end.value,
            "success": float(result.success), "env_calls": float(result.env_calls)}
    outs = []
    for k in trained_turns(result):
        turn = result.turns[k]
        prompt_ids, response_ids, logprobs = turn_tokens(tokenizer, turn.prompt, turn.generation)
        outs.append({
            "prompt_ids": prompt_ids, "response_ids": response_ids,
            "response_mask": [1] * len(response_ids), "response_logprobs": logprobs,
            "reward_score": reward, "num_turns": len(turn.prompt) + 1,
            "extra_fields": {"reward_extra_info": dict(info), "turn": k, "env": result.env,
                             "task_idx": result.task_idx, "episode_s": seconds,
                             **weight_versions(turn.generation, global_steps)}})
    return outs
