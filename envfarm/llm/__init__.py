"""The shared LLM client: any OpenAI-compatible endpoint, cached, replayable, cost-accounted.

    from envfarm.llm import LLMClient, LLMConfig
    client = LLMClient(LLMConfig.from_env(cache_dir=Path(".llm-cache")))
    res = await client.chat([{"role": "user", "content": "hi"}], stage="task", scenario="shop_1")
    res.text, res.usage.cost_usd, res.cached
"""

from envfarm.llm._accounting import UsageLedger
from envfarm.llm._client import SCENARIO_HEADER, STAGE_HEADER, LLMClient
from envfarm.llm._config import (
    DEFAULT_PRICES,
    ENV_API_KEY,
    ENV_BASE_URL,
    ENV_MODEL,
    LLMConfig,
    Price,
)
from envfarm.llm._types import ChatRequest, ChatResult, Recorded, Usage

__all__ = [
    "DEFAULT_PRICES",
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "ENV_MODEL",
    "SCENARIO_HEADER",
    "STAGE_HEADER",
    "ChatRequest",
    "ChatResult",
    "LLMClient",
    "LLMConfig",
    "Price",
    "Recorded",
    "Usage",
    "UsageLedger",
]
