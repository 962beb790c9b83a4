"""Wire-ish models of the LLM client: requests, results and usage."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Usage(BaseModel):
    """Token usage of one call (or a sum of calls) and what it cost."""

    model_config = ConfigDict(extra="forbid")

    calls: int = Field(0, description="number of calls summed here")
    cached_calls: int = Field(0, description="calls answered from the cache or a replay file")
    prompt_tokens: int = Field(0, description="prompt tokens")
    completion_tokens: int = Field(0, description="completion tokens")
    cost_usd: float = Field(0.0, description="cost in US dollars (cached calls cost 0)")

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        """Accumulate another usage into this one (in place)."""
        self.calls += other.calls
        self.cached_calls += other.cached_calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd


class ChatRequest(BaseModel):
    """Exactly what is sent; its canonical JSON is the cache key."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="model name")
    messages: list[dict[str, Any]] = Field(description="OpenAI chat messages")
    temperature: float = Field(description="sampling temperature")
    response_format: dict[str, Any] | None = Field(None, description="OpenAI response_format")
    max_tokens: int | None = Field(None, description="completion token cap")
    salt: str | None = Field(None, description="caller-chosen nonce so identical prompts can differ")

    def key(self) -> str:
        """SHA-256 of the canonical JSON of the request."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()


class ChatResult(BaseModel):
    """One chat completion: the text, its usage and whether it came from cache/replay."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="assistant message content")
    usage: Usage = Field(description="usage of this call")
    cached: bool = Field(False, description="served from the cache or a replay file")
    model: str = Field("", description="model that answered")


class Recorded(BaseModel):
    """One line of a recording / replay JSONL file (and one cache entry)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="ChatRequest.key() of the request")
    request: ChatRequest = Field(description="the request")
    text: str = Field(description="the response text")
    prompt_tokens: int = Field(0, description="prompt tokens the live call used")
    completion_tokens: int = Field(0, description="completion tokens the live call used")
