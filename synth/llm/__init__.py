"""The shared LLM client: any OpenAI-compatible endpoint, cached, replayable, cost-accounted.

    from synth.llm import LLMClient, LLMConfig
    client = LLMClient(LLMConfig.from_env(cache_dir=Path(".llm-cache")))
    res = await client.chat([{"role": "user", "content": "hi"}], stage="task", scenario="shop_1")
    res.text, res.usage.cost_usd, res.cached
"""

from synth.llm._accounting import UsageLedger
from synth.llm._client import SCENARIO_HEADER, STAGE_HEADER, LLMClient
from synth.llm._config import (
    DEFAULT_PRICES,
    ENV_API_KEY,
    ENV_BASE_URL,
    ENV_MODEL,
    LLMConfig,
    Price,
)
from synth.llm._types import ChatRequest, ChatResult, Recorded, Usage

__all__ = [
    "ChatRequest",
    "ChatResult",
    "DEFAULT_PRICES",
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "ENV_MODEL",
    "LLMClient",
    "LLMConfig",
    "Price",
    "Recorded",
    "SCENARIO_HEADER",
    "STAGE_HEADER",
    "Usage",
    "UsageLedger",
]
