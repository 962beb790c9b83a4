"""The async LLM client: cache -> replay -> live endpoint with bounded concurrency and retries."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any

import openai

from envfarm.errors import LLMError
from envfarm.llm._accounting import UsageLedger
from envfarm.llm._cache import ReplayFile, ResponseCache
from envfarm.llm._config import ENV_BASE_URL, ENV_MODEL, LLMConfig
from envfarm.llm._types import ChatRequest, ChatResult, Recorded, Usage

log = logging.getLogger(__name__)

#: Header names that tell a server (our mock, a proxy, logs) which stage/scenario is calling.
STAGE_HEADER = "X-Envfarm-Stage"
SCENARIO_HEADER = "X-Envfarm-Scenario"

_NO_ENDPOINT = (
    "no LLM endpoint configured: pass --llm-base-url and --llm-model (or set "
    f"{ENV_BASE_URL} and {ENV_MODEL}), or --llm-replay FILE to serve recorded responses offline"
)


class LLMClient:
    """Chat with any OpenAI-compatible endpoint.

    Order of lookup for each request: the on-disk cache, the replay file, then the live
    endpoint (if one is configured). Live calls are bounded by a semaphore and retried with
    exponential backoff on 429, 5xx, timeouts and connection errors.
    """

    def __init__(self, config: LLMConfig | None = None) -> None:
        self.config = config or LLMConfig.from_env()
        if not self.config.base_url and self.config.replay_path is None:
            raise LLMError(_NO_ENDPOINT)
        if self.config.base_url and not (self.config.model or self.config.stage_models):
            raise LLMError(f"LLM endpoint {self.config.base_url} has no model: pass --llm-model or set {ENV_MODEL}")
        self.ledger = UsageLedger()
        self._cache = ResponseCache(self.config.cache_dir) if self.config.cache_dir else None
        self._replay = ReplayFile(self.config.replay_path) if self.config.replay_path else None
        self._recorder = ReplayFile(self.config.record_path) if self.config.record_path else None
        self._sem = asyncio.Semaphore(self.config.max_concurrency)
        self._openai: openai.AsyncOpenAI | None = None
        if self.config.base_url:
            self._openai = openai.AsyncOpenAI(
                base_url=self.config.base_url,
                api_key=self.config.api_key or "EMPTY",
                max_retries=0,  # we retry ourselves, with accounting and logging
                timeout=self.config.timeout_s,
            )

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        stage: str | None = None,
        scenario: str | None = None,
        response_format: dict[str, Any] | None = None,
        temperature: float | None = None,
        salt: str | None = None,
    ) -> ChatResult:
        """One chat completion; ``salt`` makes otherwise identical requests distinct cache keys."""
        request = ChatRequest(
            model=self.config.model_for(stage),
            messages=messages,
            temperature=self.config.default_temperature if temperature is None else temperature,
            response_format=response_format,
            max_tokens=self.config.max_tokens,
            salt=salt,
        )
        key = request.key()
        hit = (self._cache.get(key) if self._cache is not None else None) or (
            self._replay.get(key) if self._replay is not None else None
        )
        if hit is not None:
            usage = Usage(calls=1, cached_calls=1, prompt_tokens=hit.prompt_tokens, completion_tokens=hit.completion_tokens)
            self.ledger.add(usage, stage=stage, scenario=scenario)
            return ChatResult(text=hit.text, usage=usage, cached=True, model=request.model)
        if self._openai is None:
            raise LLMError(
                f"replay file {self.config.replay_path} has no response for this {stage or 'unnamed'} request "
                f"(scenario {scenario!r}); record it against a live endpoint first",
                stage=stage, scenario=scenario,
            )
        text, prompt_tokens, completion_tokens = await self._live(request, stage=stage, scenario=scenario)
        record = Recorded(key=key, request=request, text=text, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        if self._cache is not None:
            self._cache.put(record)
        if self._recorder is not None:
            self._recorder.append(record)
        cost = self.config.price_for(request.model).cost(prompt_tokens, completion_tokens)
        usage = Usage(calls=1, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cost_usd=cost)
        self.ledger.add(usage, stage=stage, scenario=scenario)
        return ChatResult(text=text, usage=usage, cached=False, model=request.model)

    async def _live(self, request: ChatRequest, *, stage: str | None, scenario: str | None) -> tuple[str, int, int]:
        if self._openai is None:
            raise LLMError(_NO_ENDPOINT)
        headers = {STAGE_HEADER: stage or "", SCENARIO_HEADER: scenario or ""}
        kwargs: dict[str, Any] = {"model": request.model, "messages": request.messages, "temperature": request.temperature}
        if request.response_format is not None:
            kwargs["response_format"] = request.response_format
        if request.max_tokens is not None:
            kwargs["max_tokens"] = request.max_tokens
        last = ""
        last_retry_after: float | None = None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._delay(attempt, last_retry_after))
            last_retry_after = None
            try:
                async with self._sem:
                    resp = await self._openai.chat.completions.create(extra_headers=headers, **kwargs)
                choices = getattr(resp, "choices", None)
                if not choices:
                    last = f"endpoint answered without choices: {str(resp)[:200]!r}"
                    continue
                text = choices[0].message.content or ""
                usage = getattr(resp, "usage", None)
                return text, int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0)
            except openai.APIStatusError as exc:
                if exc.status_code != 429 and exc.status_code < 500:
                    raise LLMError(f"LLM endpoint refused the request ({exc.status_code}): {exc.message}",
                                   stage=stage, scenario=scenario, status=exc.status_code) from exc
                last = f"HTTP {exc.status_code}: {exc.message}"
                last_retry_after = _retry_after(exc)
            except (openai.APIConnectionError, openai.APIResponseValidationError, ValueError) as exc:
                # APITimeoutError is an APIConnectionError; a 200 whose body is not JSON is a ValueError
                last = f"{type(exc).__name__}: {exc}"
            log.info("LLM call for stage=%s scenario=%s failed (attempt %d): %s", stage, scenario, attempt + 1, last)
        raise LLMError(
            f"LLM endpoint {self.config.base_url} kept failing after {self.config.max_retries + 1} attempts: {last}",
            stage=stage, scenario=scenario,
        )

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        backoff = min(self.config.backoff_max_s, self.config.backoff_base_s * 2 ** (attempt - 1))
        if retry_after is not None:
            backoff = min(self.config.backoff_max_s, max(backoff, retry_after))
        return backoff * (1 + 0.1 * random.random())  # jitter so many clients don't retry in lockstep

    async def embed(self, texts: list[str], *, model: str | None = None) -> list[list[float]]:
        """Embeddings from the endpoint's ``/embeddings``; cached, recorded and replayed like chat."""
        name = model or self.config.embedding_model or self.config.model_for("embed")
        # One cache/replay format for both endpoints: the texts as messages, the vectors as JSON text.
        request = ChatRequest(model=name, messages=[{"role": "embed", "content": t} for t in texts],
                              temperature=0.0, salt="embeddings")
        key = request.key()
        hit = (self._cache.get(key) if self._cache is not None else None) or (
            self._replay.get(key) if self._replay is not None else None
        )
        if hit is not None:
            return json.loads(hit.text)
        if self._openai is None:
            raise LLMError(_NO_ENDPOINT if self._replay is None else
                           f"replay file {self.config.replay_path} has no embeddings for these texts")
        last = ""
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._delay(attempt, None))
            try:
                async with self._sem:
                    resp = await self._openai.embeddings.create(model=name, input=texts)
                vectors = [list(d.embedding) for d in sorted(resp.data, key=lambda d: d.index)]
                break
            except openai.APIStatusError as exc:
                if exc.status_code != 429 and exc.status_code < 500:
                    raise LLMError(f"embeddings endpoint refused the request ({exc.status_code}): {exc.message}") from exc
                last = f"HTTP {exc.status_code}"
            except (openai.APIConnectionError, openai.APIResponseValidationError, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"
        else:
            raise LLMError(f"embeddings endpoint kept failing: {last}")
        record = Recorded(key=key, request=request, text=json.dumps(vectors))
        if self._cache is not None:
            self._cache.put(record)
        if self._recorder is not None:
            self._recorder.append(record)
        return vectors

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        if self._openai is not None:
            await self._openai.close()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _retry_after(exc: openai.APIStatusError) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (AttributeError, ValueError):
        return None
