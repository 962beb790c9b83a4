"""A local Hugging Face ``transformers`` causal LM as the agent loop's policy (CPU or GPU).

The same class loads the tiny test model and a real checkpoint (a Qwen3-4B folder) from a
path. Each generation returns the prompt and completion token ids and the completion's
log-probabilities, which is what a trainer needs to build its samples without re-tokenizing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from judge import Message
from trainer.format import IM_END, render
from trainer.policy import FINISH_LENGTH, FINISH_STOP, Generation, TurnContext


def load_model(path: str | Path, device: str = "cpu", dtype: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) from an HF folder; quiet (no progress bars), no network."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    torch_dtype = getattr(torch, dtype) if dtype else None
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch_dtype)
    return model.to(device), tokenizer


def end_token_id(tokenizer: Any) -> int:
    """The id that ends an assistant turn (<|im_end|>)."""
    return tokenizer.convert_tokens_to_ids(IM_END)


def encode_prompt(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    return tokenizer(render(messages), add_special_tokens=False).input_ids


def encode_completion(tokenizer: Any, text: str, finished: bool = True) -> list[int]:
    """Token ids of an assistant turn's text, closed by <|im_end|> when it finished."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return ids + [end_token_id(tokenizer)] if finished else ids


class HFPolicy:
    """Sampling from a local causal LM; one generation at a time (the model is shared)."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, *, max_new_tokens: int = 512,
                 temperature: float = 1.0, top_p: float = 1.0) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self._lock = threading.Lock()

    @classmethod
    def from_path(cls, path: str | Path, device: str = "cpu", **kw: Any) -> HFPolicy:
        model, tokenizer = load_model(path, device)
        return cls(model, tokenizer, **kw)

    async def generate(self, messages: Sequence[Message], ctx: TurnContext) -> Generation:
        return await asyncio.to_thread(self._generate, list(messages))

    def _generate(self, messages: list[Message]) -> Generation:
        import torch

        prompt_ids = encode_prompt(self.tokenizer, messages)
        eos = end_token_id(self.tokenizer)
        with self._lock, torch.no_grad():
            was_training = self.model.training
            self.model.eval()
            try:
                ids = torch.tensor([prompt_ids], device=self.model.device)
                out = self.model.generate(
                    ids, attention_mask=torch.ones_like(ids), do_sample=self.temperature > 0,
                    temperature=self.temperature if self.temperature > 0 else None,
                    top_p=self.top_p, top_k=0, max_new_tokens=self.max_new_tokens,
                    eos_token_id=eos, pad_token_id=self.tokenizer.pad_token_id,
                    return_dict_in_generate=True, output_logits=True)
            finally:
                self.model.train(was_training)
        completion = out.sequences[0, len(prompt_ids):].tolist()
        logits = torch.stack(out.logits, dim=1)[0].float()  # raw logits, one row per new token
        if self.temperature > 0:  # the sampling policy's log-probs (what GRPO's ratio starts at)
            logits = logits / self.temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(
            1, torch.tensor(completion, device=logits.device)[:, None])[:, 0].tolist()
        finished = bool(completion) and completion[-1] == eos
        body = completion[:-1] if finished else completion
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        return Generation(text=text, finish_reason=FINISH_STOP if finished else FINISH_LENGTH,
                          prompt_ids=prompt_ids, completion_ids=completion, logprobs=logprobs,
                          policy=self.name)
