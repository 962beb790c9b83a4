"""The Qwen3 format, the tiny model and the local HF policy agree with each other."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from judge import Message
from trainer.format import (
    TurnKind,
    call_tool_text,
    parse_assistant,
    render,
    system_prompt,
    tool_call_text,
)
from trainer.grpo import Sample, completion_logprobs
from trainer.hf import HFPolicy, load_model
from trainer.policy import FINISH_LENGTH, FINISH_STOP, TurnContext

CONVERSATION = [Message(role="system", content=system_prompt()),
                Message(role="user", content="Lock my card."),
                Message(role="assistant", content=tool_call_text("list_tools", {}, "list")),
                Message(role="tool", content='{"ok": true, "result": []}'),
                Message(role="assistant", content=call_tool_text("lock_card", {"card_id": 2}, "x")),
                Message(role="tool", content='{"ok": true, "result": {"locked": true}}')]


def test_render_equals_the_saved_chat_template(tiny_model):
    _, tokenizer = load_model(tiny_model)
    wire = [m.model_dump(exclude_none=True) for m in CONVERSATION]
    for gen in (True, False):
        assert render(CONVERSATION, gen) == tokenizer.apply_chat_template(
            wire, tokenize=False, add_generation_prompt=gen)
    ids = tokenizer(render(CONVERSATION), add_special_tokens=False).input_ids
    tokens = set(tokenizer.convert_ids_to_tokens(ids))
    assert {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
            "</tool_call>", "<tool_response>"} <= tokens  # specials are single tokens
    assert tokenizer.decode(ids) == render(CONVERSATION)


def test_tiny_model_is_a_small_qwen3(tiny_model):
    model, tokenizer = load_model(tiny_model)
    assert model.config.model_type == "qwen3"
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    assert model.config.vocab_size == len(tokenizer)


def test_parse_assistant_kinds():
    assert parse_assistant(CONVERSATION[4].content).kind is TurnKind.call
    assert parse_assistant("<think>ok</think> Done.").kind is TurnKind.final
    two = tool_call_text("list_tools", {}, "a") + "<tool_call>{\"name\": \"x\"}</tool_call>"
    assert parse_assistant(two).kind is TurnKind.malformed
    assert parse_assistant("<think>a</think><tool_call>{bad</tool_call>").kind is TurnKind.malformed


async def test_hf_policy_returns_ids_and_logprobs_training_recomputes(tiny_model):
    torch.manual_seed(0)
    model, tokenizer = load_model(tiny_model)
    policy = HFPolicy(model, tokenizer, max_new_tokens=6)
    gen = await policy.generate(CONVERSATION[:2], TurnContext("e", 0, "t", 0))
    assert gen.finish_reason in (FINISH_STOP, FINISH_LENGTH)
    assert len(gen.completion_ids) == len(gen.logprobs) <= 6
    assert gen.prompt_ids == tokenizer(render(CONVERSATION[:2]),
                                       add_special_tokens=False).input_ids
    with torch.no_grad():
        again = completion_logprobs(model, [Sample(gen.prompt_ids, gen.completion_ids, 0.0)],
                                    tokenizer.pad_token_id).tolist()
    assert again == __import__("pytest").approx(gen.logprobs, abs=1e-3)


def test_only_the_actor_imports_ray():
    root = Path(__file__).resolve().parents[2] / "trainer"
    importers = set()
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "ray" or n.startswith("ray.") for n in names):
                importers.add(path.name)
    assert importers <= {"actor.py", "verl_plugin.py"}  # the verl plugin lives in verl's world
    assert "actor.py" in importers
