"""The verl path's prompt budget, without verl: the loop's episode settings
(``trainer.verl_bridge.loop_episode_config``, what ``EnvfarmAgentLoop`` builds from
``rollout.prompt_length``), real episodes against the in-process farm, turns from
``ServerPolicy`` over a server that records the prompt ids it is sent, and the tiny model's
tokenizer. The bundled envs' full tool listings are 12-14k of its tokens."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from judge import Message
from trainer.budget import PromptBudget, PromptBudgetError
from trainer.episode import EpisodeConfig, run_episode
from trainer.format import call_tool_text, final_text, render, tool_call_text
from trainer.verl_bridge import ServerPolicy, loop_episode_config

from .conftest import leased

ENV = "hotel_booking_1"
BUDGET = 2000  # tokens: the names-only listing's prompt is ~860 here, the full one ~12,000
TURNS = [tool_call_text("list_tools", {}, "I list the tools."),
         call_tool_text("search_hotels", {"city": "Lisbon"}, "Search."),
         final_text("Done.", "Nothing more to do.")]


class RecordingServer:
    """Answers verl's ``generate`` with the given turns; keeps every prompt it was sent."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.prompts: list[list[int]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any]) -> SimpleNamespace:
        text = TURNS[min(len(self.prompts), len(TURNS) - 1)]
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        # what ServerPolicy reads of verl's TokenOutput
        return SimpleNamespace(token_ids=ids, log_probs=[-0.5] * len(ids), extra_fields={})


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def _config(tokenizer, **kwargs) -> EpisodeConfig:
    return loop_episode_config(tokenizer, **{"prompt_length": BUDGET, "max_turns": 5,
                                             "window": 3, "tool_listing": "full",
                                             "max_tool_chars": 300, **kwargs})


async def _episode(farm, tokenizer, config: EpisodeConfig):
    server = RecordingServer(tokenizer)
    policy = ServerPolicy(server, tokenizer, {"temperature": 1.0}, max_tokens=256)
    return await run_episode(farm, policy, ENV, 0, config=config), server


def _listing(result) -> Any:
    (tool,) = [m for m in result.trajectory.messages if m.role == "tool"][:1]
    return json.loads(tool.content)["result"]


async def test_without_a_budget_the_full_listing_overflows_it(farm, tokenizer):
    """The premise: today's full listing does not fit the small budget."""
    result, server = await _episode(farm, tokenizer, EpisodeConfig(max_turns=5,
                                                                   max_tool_chars=300))
    assert len(server.prompts[1]) > 5 * BUDGET
    assert isinstance(_listing(result)[0], dict)  # names, descriptions and schemas


async def test_an_overflowing_listing_becomes_names_only(farm, tokenizer):
    result, server = await _episode(farm, tokenizer, _config(tokenizer))
    assert result.valid and len(server.prompts) == 3
    assert max(len(p) for p in server.prompts) <= BUDGET  # every prompt sent fits, uncut
    names = _listing(result)
    assert names == [t.name for t in result.trajectory.tools] and len(names) > 30
    # what the server got is the windowed conversation, whole: the names listing included
    assert tokenizer.decode(server.prompts[1]) == render(result.turns[1].prompt)
    assert result.trajectory.tools[0].input_schema  # the schemas stay in the trajectory


async def test_a_listing_that_fits_is_shown_as_configured(farm, tokenizer):
    result, server = await _episode(farm, tokenizer,
                                    _config(tokenizer, prompt_length=40_000))
    assert isinstance(_listing(result)[0], dict) and len(server.prompts[1]) > BUDGET


async def test_on_long_prompt_fail_names_the_budget(farm, farm_core, tokenizer):
    server = RecordingServer(tokenizer)
    policy = ServerPolicy(server, tokenizer, {}, max_tokens=256)
    with pytest.raises(PromptBudgetError, match=r"over the listing limit of 1000 tokens "
                                                r"\(prompt budget 2000 minus 1000"):
        await run_episode(farm, policy, ENV, 0,
                          config=_config(tokenizer, on_long_prompt="fail"))
    assert len(server.prompts) == 1  # only the first turn's: the listing was never sent
    assert leased(farm_core) == 0  # the lease went back


async def test_a_budget_too_small_even_for_names_fails_before_sending(farm, tokenizer):
    with pytest.raises(PromptBudgetError, match="even with tool names only") as err:
        await _episode(farm, tokenizer, _config(tokenizer, prompt_length=1200))
    assert "1200" in str(err.value) and "data.max_prompt_length" in str(err.value)


async def test_a_later_prompt_over_the_budget_fails_before_it_is_sent(farm, tokenizer):
    """The reserve left room for one turn, not for a 300-char tool result: the third prompt
    is over the budget and never reaches the server."""
    config = _config(tokenizer, prompt_reserve=60, prompt_length=1000)
    server = RecordingServer(tokenizer)
    policy = ServerPolicy(server, tokenizer, {}, max_tokens=256)
    with pytest.raises(PromptBudgetError, match=r"turn 2: the prompt is \d+ tokens, over the "
                                                r"prompt budget of 1000 tokens"):
        await run_episode(farm, policy, ENV, 0, config=config)
    assert len(server.prompts) == 2 and max(len(p) for p in server.prompts) <= 1000


def test_budget_settings_are_checked():
    def count(messages: list[Message]) -> int:
        return len(messages)

    with pytest.raises(ValueError, match="on_overflow"):
        PromptBudget(100, count, on_overflow="truncate")
    with pytest.raises(ValueError, match="reserve"):
        PromptBudget(100, count, reserve=100)
    assert PromptBudget(100, count).listing_limit == 50
    assert PromptBudget(100, count, reserve=10).listing_limit == 90
