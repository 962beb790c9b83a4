"""A tiny Qwen3-architecture model that runs here: random weights, a tokenizer trained locally.

No weights can be downloaded on our machines, so CPU tests and the ``train`` demo build one:
``transformers.Qwen3Config`` with a few hundred thousand parameters, and a byte-level BPE
tokenizer trained with ``tokenizers`` on text we ship (the bundled catalog's tasks, tool names
and descriptions, reference solutions) plus the Qwen3 special tokens and chat template. It is
saved in Hugging Face format, so the code that loads it loads a real checkpoint (Qwen3-4B) from
a path the same way.

    path = tiny_model_path()            # built once, cached under ~/.cache/envfarm (or
                                        # $ENVFARM_CACHE), keyed by a hash of what went in
    path = build_tiny_model(out_dir)    # or build into a folder of your own
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Qwen3's special tokens (same strings as the real tokenizer, so prompts read the same).
EOS = "<|im_end|>"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", EOS, "<think>", "</think>", "<tool_call>",
                  "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>"]

#: The model's shape: ~0.4M parameters with the 2,048-token vocabulary (embeddings tied).
TINY_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 8192,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
VOCAB_SIZE = 2048
_BUILD_VERSION = "1"  # bump when the build changes in a way the hash of inputs cannot see


def corpus(catalog_path: str | Path | None = None) -> Iterator[str]:
    """Text the tokenizer learns from: what a prompt of this project is made of."""
    from envfarm import load_catalog

    catalog = load_catalog(catalog_path)
    for name in catalog.names:
        bundle = catalog[name]
        yield name
        yield bundle.description
        yield from bundle.tasks
        for group in (bundle.api_spec or {}).get("api_groups", []):
            for ep in group.get("endpoints", []):
                yield " ".join(str(ep.get(k, "")) for k in ("operation_id", "summary",
                                                            "description"))
        for calls in bundle.solutions.values():
            for call in calls:
                yield json.dumps({"name": "call_tool", "arguments": {
                    "tool_name": call.tool, "arguments": json.dumps(call.arguments)}})
    # the agent-loop scaffolding itself (format.py writes these)
    yield from ('{"name": "list_tools", "arguments": {}}', '{"ok": true, "result": []}',
                '{"ok": false, "error": {"kind": "agent_error", "message": ""}}',
                "You are an agent that completes the user's task with the environment's tools.")


def build_tiny_model(out_dir: str | Path, seed: int = 0,
                     catalog_path: str | Path | None = None) -> Path:
    """Train the tokenizer, build the random-init model, save both (HF format) into out_dir."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast = train_tokenizer(list(corpus(catalog_path)), VOCAB_SIZE)
    fast.save_pretrained(out)

    config = Qwen3Config(vocab_size=len(fast), bos_token_id=None,
                         eos_token_id=fast.convert_tokens_to_ids(EOS),
                         pad_token_id=fast.pad_token_id, **TINY_CONFIG)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out)
    return out


def train_tokenizer(texts: list[str], vocab_size: int, *, split_digits: bool = False,
                    identifiers: bool = False) -> Any:
    """A byte-level BPE tokenizer learned from ``texts``, with Qwen3's special tokens and chat
    template. ``split_digits``: every digit its own token, so a number never seen in training is
    still made of pieces that were (copying an id or an amount from a request stays learnable).
    ``identifiers``: a snake_case name (``create_payee``, ``account_id``) is one word that BPE may
    merge whole, not words split at each ``_`` (a tool listing then costs a token per tool)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trainer.format import CHAT_TEMPLATE

    tok = Tokenizer(models.BPE())
    steps = []
    if identifiers:  # GPT-2's split with "_" a letter (and, split_digits, one digit a word)
        digits = r" ?\p{N}" if split_digits else r" ?\p{N}+"
        steps.append(pre_tokenizers.Split(Regex(r"'s|'t|'re|'ve|'m|'ll|'d| ?[\p{L}_]+|" + digits +
                                                r"| ?[^\s\p{L}\p{N}_]+|\s+(?!\S)|\s+"), "isolated"))
    elif split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not identifiers))
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[3:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model_path(seed: int = 0, cache_dir: str | Path | None = None) -> Path:
    """The tiny model, built on first use and cached under a key of everything that shapes it."""
    from trainer.format import CHAT_TEMPLATE

    key = hashlib.sha256(json.dumps({
        "v": _BUILD_VERSION, "seed": seed, "config": TINY_CONFIG, "vocab": VOCAB_SIZE,
        "special": SPECIAL_TOKENS, "template": CHAT_TEMPLATE, "corpus": list(corpus()),
    }, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_dir or os.environ.get("ENVFARM_CACHE") or
                Path.home() / ".cache" / "envfarm") / "models"
    final = root / f"tiny-qwen3-{key}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    # Build beside the final place, then rename: a concurrent or killed build leaves no half model.
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=root))
    try:
        build_tiny_model(tmp, seed=seed)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / "config.json").is_file():
                raise  # not "someone else finished first"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
