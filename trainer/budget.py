"""The prompt budget: every prompt measured with the model's tokenizer before it is sent.

verl gives each sample's prompt ``rollout.prompt_length`` tokens (``data.max_prompt_length``,
6,144 in ``verl_example.yaml``), while a full ``list_tools`` answer of a bundled env is 29.6-34.7k
characters (roughly 7-10k Qwen3 tokens). Nothing may be cut to fit: the agent loop measures the
windowed prompt, rendered exactly as the server will get it, and

- at ``list_tools``: shows the configured listing only when the prompt holding it leaves
  ``reserve`` tokens (default: half the budget) for the window's later turns; otherwise the
  tool names alone (``on_overflow="names"``), or it fails (``"fail"``);
- at every turn: a prompt over the budget fails.

Failing is a ``PromptBudgetError`` that names the budget, the prompt's size and where it
happened: a setting to change, not the agent's doing, so it stops the run instead of scoring
the episode.

    budget = PromptBudget.of_tokenizer(tokenizer, 6144)
    EpisodeConfig(prompt_budget=budget, ...)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from judge import Message
from trainer.format import render

ON_OVERFLOW = ("names", "fail")
_ADVICE = ("raise data.max_prompt_length (verl's rollout.prompt_length), or shorten the "
           "prompts: tool_listing names, a smaller window, a lower max_tool_chars")


class PromptBudgetError(ValueError):
    """A prompt does not fit the prompt budget (the configuration's, never the agent's fault)."""


@dataclass
class PromptBudget:
    """``tokens``: the most a prompt may hold; ``count``: a prompt's tokens as the model's
    tokenizer reads it; ``reserve``: tokens the prompt holding the tool listing leaves for
    later turns (None: half the budget); ``on_overflow``: ``names`` or ``fail``."""

    tokens: int
    count: Callable[[Sequence[Message]], int]
    reserve: int | None = None
    on_overflow: str = "names"

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"the prompt budget must be a positive token count, not {self.tokens}")
        if self.on_overflow not in ON_OVERFLOW:
            raise ValueError(f"on_overflow must be one of {ON_OVERFLOW}, not {self.on_overflow!r}")
        if self.reserve is not None and not 0 <= self.reserve < self.tokens:
            raise ValueError(f"reserve must be in [0, {self.tokens}), not {self.reserve}")

    @classmethod
    def of_tokenizer(cls, tokenizer: Any, tokens: int, **kwargs: Any) -> PromptBudget:
        """A budget measured the way ``trainer.verl_bridge.ServerPolicy`` encodes prompts."""
        def count(messages: Sequence[Message]) -> int:
            return len(tokenizer.encode(render(messages), add_special_tokens=False))

        return cls(tokens, count, **kwargs)

    @property
    def listing_limit(self) -> int:
        """The most tokens the prompt holding the tool listing may take."""
        return self.tokens - (self.tokens // 2 if self.reserve is None else self.reserve)

    def choose_listing(self, head: Sequence[Message], shown: str, names: Callable[[], str],
                       where: str) -> str:
        """The ``list_tools`` answer to show after ``head`` (the conversation so far): ``shown``
        if its prompt fits the listing limit, else the names-only listing ``names()`` (or a
        ``PromptBudgetError`` where that does not fit either, or ``on_overflow`` is ``fail``)."""
        used = self._with_listing(head, shown)
        if used <= self.listing_limit:
            return shown
        limit = (f"the listing limit of {self.listing_limit} tokens (prompt budget "
                 f"{self.tokens} minus {self.tokens - self.listing_limit} reserved for "
                 "later turns)")
        if self.on_overflow == "fail":
            raise PromptBudgetError(f"{where}: the prompt holding the tool listing is {used} "
                                    f"tokens, over {limit}; set on_overflow 'names' to list "
                                    f"the tool names only, or {_ADVICE}")
        short = names()
        used_names = self._with_listing(head, short)
        if used_names > self.listing_limit:
            raise PromptBudgetError(f"{where}: even with tool names only, the prompt holding the "
                                    f"listing is {used_names} tokens, over {limit}; {_ADVICE}")
        return short

    def check(self, prompt: Sequence[Message], where: str) -> int:
        """A prompt's token count; ``PromptBudgetError`` if it is over the budget."""
        used = self.count(prompt)
        if used > self.tokens:
            raise PromptBudgetError(f"{where}: the prompt is {used} tokens, over the prompt "
                                    f"budget of {self.tokens} tokens; {_ADVICE}")
        return used

    def _with_listing(self, head: Sequence[Message], content: str) -> int:
        return self.count([*head, Message(role="tool", content=content)])
