"""The shared LLM client against the real local mock server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envfarm.errors import LLMError
from envfarm.llm import LLMClient, LLMConfig, Price
from tests.fakes.mock_openai import MockOpenAI, Reply

MSG = [{"role": "user", "content": "Say hello"}]


def _client(mock: MockOpenAI, tmp_path: Path | None = None, **kw: object) -> LLMClient:
    cfg = LLMConfig(base_url=mock.url, model="mock", api_key="k", backoff_base_s=0.01, **kw)
    return LLMClient(cfg)


async def test_chat_returns_text_usage_and_sends_stage_headers(mock_openai: MockOpenAI) -> None:
    mock_openai.script("hello there", stage="task")
    client = _client(mock_openai, prices={"mock": Price(input_per_mtok=1e6, output_per_mtok=2e6)})
    res = await client.chat(MSG, stage="task", scenario="shop_1")
    assert res.text == "hello there"
    assert not res.cached
    assert res.usage.prompt_tokens >= 1 and res.usage.completion_tokens >= 1
    assert res.usage.cost_usd == pytest.approx(res.usage.prompt_tokens * 1 + res.usage.completion_tokens * 2)
    seen = mock_openai.requests_for(stage="task", scenario="shop_1")
    assert len(seen) == 1 and seen[0].model == "mock"
    assert client.ledger.by_stage["task"].calls == 1
    assert client.ledger.by_scenario["shop_1"].cost_usd == pytest.approx(res.usage.cost_usd)
    await client.aclose()


async def test_retries_429_500_and_non_json_body_then_succeeds(mock_openai: MockOpenAI) -> None:
    mock_openai.script(Reply.error(429), Reply.error(500), Reply(raw_body="<html>oops"), "finally")
    client = _client(mock_openai)
    res = await client.chat(MSG)
    assert res.text == "finally"
    assert len(mock_openai.requests) == 4
    await client.aclose()


async def test_gives_up_with_llm_error_after_retry_budget(mock_openai: MockOpenAI) -> None:
    mock_openai.script(Reply.error(503), repeat=True)
    client = _client(mock_openai, max_retries=2)
    with pytest.raises(LLMError, match="kept failing after 3 attempts"):
        await client.chat(MSG)
    assert len(mock_openai.requests) == 3
    await client.aclose()


async def test_4xx_is_not_retried(mock_openai: MockOpenAI) -> None:
    client = _client(mock_openai)  # nothing scripted -> the mock answers 400
    with pytest.raises(LLMError, match="refused the request \\(400\\)"):
        await client.chat(MSG)
    assert len(mock_openai.requests) == 1
    await client.aclose()


async def test_timeout_is_retried(mock_openai: MockOpenAI) -> None:
    mock_openai.script(Reply(text="late", latency_s=2.0), "on time")
    client = _client(mock_openai, timeout_s=0.3)
    res = await client.chat(MSG)
    assert res.text == "on time"
    await client.aclose()


async def test_cache_makes_rerun_free_and_salt_separates(mock_openai: MockOpenAI, tmp_path: Path) -> None:
    mock_openai.script("one", "two", "three")
    client = _client(mock_openai, cache_dir=tmp_path / "cache", prices={"mock": Price(input_per_mtok=1.0)})
    first = await client.chat(MSG, stage="db")
    again = LLMClient(client.config)  # a new process would see the same cache
    second = await again.chat(MSG, stage="db")
    assert (first.text, second.text) == ("one", "one")
    assert second.cached and second.usage.cost_usd == 0
    assert (await again.chat(MSG, stage="db", salt="round-2")).text == "two"
    assert len(mock_openai.requests) == 2
    await client.aclose()
    await again.aclose()


async def test_record_then_replay_offline(mock_openai: MockOpenAI, tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    mock_openai.script("recorded answer")
    live = _client(mock_openai, record_path=rec)
    await live.chat(MSG, stage="spec", temperature=0.0)
    await live.aclose()
    assert len(rec.read_text().splitlines()) == 1
    replay = LLMClient(LLMConfig(model="mock", replay_path=rec))
    res = await replay.chat(MSG, stage="spec", temperature=0.0)
    assert res.text == "recorded answer" and res.cached
    with pytest.raises(LLMError, match="has no response"):
        await replay.chat([{"role": "user", "content": "other"}], stage="spec", temperature=0.0)
    # A recorder killed mid-line leaves a torn tail: it is cut, and the recording stays usable.
    with open(rec, "a") as fh:
        fh.write('{"key": "abc", "requ')
    again = LLMClient(LLMConfig(model="mock", replay_path=rec))
    assert (await again.chat(MSG, stage="spec", temperature=0.0)).text == "recorded answer"
    assert rec.read_text().endswith("\n")


def test_no_endpoint_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ENVFARM_LLM_BASE_URL", "ENVFARM_LLM_MODEL", "ENVFARM_LLM_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(LLMError, match="no LLM endpoint configured"):
        LLMClient(LLMConfig.from_env())


def test_config_from_env_and_stage_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVFARM_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("ENVFARM_LLM_MODEL", "m-env")
    cfg = LLMConfig.from_env(model="m-flag", stage_models={"env": "big"})
    assert cfg.base_url == "http://127.0.0.1:9/v1"
    assert cfg.model_for("env") == "big" and cfg.model_for("task") == "m-flag"
    assert cfg.model_for("env.fix") == "big" and cfg.model_for(None) == "m-flag"


async def test_concurrency_is_bounded(mock_openai: MockOpenAI) -> None:
    import asyncio

    mock_openai.latency_s = 0.1
    mock_openai.script(lambda req: "x", repeat=True)
    client = _client(mock_openai, max_concurrency=3)
    await asyncio.gather(*(client.chat([{"role": "user", "content": str(i)}]) for i in range(9)))
    assert mock_openai.max_in_flight == 3
    await client.aclose()


async def test_embeddings_endpoint(mock_openai: MockOpenAI) -> None:
    client = _client(mock_openai)
    vecs = await client.embed(["online shop", "online shop", "bank"])
    dot = sum(a * b for a, b in zip(vecs[0], vecs[1]))
    assert dot == pytest.approx(1.0)
    assert json.loads(json.dumps(vecs))  # plain floats
    await client.aclose()
