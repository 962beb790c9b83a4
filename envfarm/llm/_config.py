"""Configuration of the LLM client: endpoint, per-stage models, concurrency, retries, prices."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

#: Environment variables read by :meth:`LLMConfig.from_env` (flags win over them).
ENV_BASE_URL = "ENVFARM_LLM_BASE_URL"
ENV_MODEL = "ENVFARM_LLM_MODEL"
ENV_API_KEY = "ENVFARM_LLM_API_KEY"


class Price(BaseModel):
    """What one model costs, in US dollars per million tokens."""

    model_config = ConfigDict(extra="forbid")

    input_per_mtok: float = Field(0.0, ge=0, description="USD per 1M prompt tokens")
    output_per_mtok: float = Field(0.0, ge=0, description="USD per 1M completion tokens")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Dollar cost of one call."""
        return (prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok) / 1e6


#: Public list prices (USD / 1M tokens) of a few common models; extend through ``LLMConfig.prices``.
DEFAULT_PRICES: dict[str, Price] = {
    "gpt-5": Price(input_per_mtok=1.25, output_per_mtok=10.0),
    "gpt-5-mini": Price(input_per_mtok=0.25, output_per_mtok=2.0),
    "gpt-4.1": Price(input_per_mtok=2.0, output_per_mtok=8.0),
    "gpt-4.1-mini": Price(input_per_mtok=0.4, output_per_mtok=1.6),
    "gpt-4o": Price(input_per_mtok=2.5, output_per_mtok=10.0),
    "gpt-4o-mini": Price(input_per_mtok=0.15, output_per_mtok=0.6),
}


class LLMConfig(BaseModel):
    """Where and how to call the LLM. ``replay_path`` alone is enough to run offline."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(None, description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8001/v1")
    model: str | None = Field(None, description="default model for every stage")
    api_key: str | None = Field(None, description="bearer key; local servers accept any string")
    stage_models: dict[str, str] = Field(default_factory=dict, description="stage name -> model overriding `model`")
    max_concurrency: int = Field(16, ge=1, description="LLM calls in flight at once (per client)")
    max_retries: int = Field(5, ge=0, description="retries on 429 / 5xx / timeouts / connection errors")
    backoff_base_s: float = Field(0.5, ge=0, description="first retry delay; doubles each retry")
    backoff_max_s: float = Field(30.0, ge=0, description="upper bound of one retry delay")
    timeout_s: float = Field(300.0, gt=0, description="per-request timeout")
    default_temperature: float = Field(0.7, ge=0, le=2, description="temperature when the caller gives none")
    max_tokens: int | None = Field(None, ge=1, description="completion token cap sent with each request")
    prices: dict[str, Price] = Field(default_factory=lambda: dict(DEFAULT_PRICES), description="model -> price")
    cache_dir: Path | None = Field(None, description="on-disk response cache; None disables it")
    replay_path: Path | None = Field(None, description="JSONL recording to serve responses from (offline)")
    record_path: Path | None = Field(None, description="append every live request/response pair here")
    embedding_model: str | None = Field(None, description="model name for the embeddings endpoint")

    @classmethod
    def from_env(cls, **overrides: object) -> LLMConfig:
        """Build from ``ENVFARM_LLM_*`` variables; keyword arguments that are not None win."""
        values: dict[str, object] = {
            "base_url": os.environ.get(ENV_BASE_URL) or None,
            "model": os.environ.get(ENV_MODEL) or None,
            "api_key": os.environ.get(ENV_API_KEY) or None,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)

    def model_for(self, stage: str | None) -> str:
        """The model a stage uses (falls back to the default model)."""
        # "env.fix" (an error summary of the env stage) uses the env stage's model unless named itself.
        for key in (stage, stage.split(".", 1)[0]) if stage else ():
            if key in self.stage_models:
                return self.stage_models[key]
        return self.model or "default"

    def price_for(self, model: str) -> Price:
        """The price of a model; unknown models cost 0 (local servers)."""
        return self.prices.get(model, Price())
