"""The scripted mock OpenAI server itself (other helpers' tests rely on it)."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.fakes.mock_openai import MockOpenAI, Reply


def _ask(mock: MockOpenAI, text: str, **headers: str) -> httpx.Response:
    return httpx.post(f"{mock.url}/chat/completions", headers=headers,
                      json={"model": "m", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": text}]})


def test_rules_match_in_order_and_record_requests(mock_openai: MockOpenAI) -> None:
    mock_openai.script("db answer", stage="db")
    mock_openai.script("verdict", pattern=r"Trajectory:.*done")
    mock_openai.script(lambda req: f"echo {req.last_user}", repeat=True)
    assert _ask(mock_openai, "hi", **{"X-Envfarm-Stage": "db"}).json()["choices"][0]["message"]["content"] == "db answer"
    assert _ask(mock_openai, "Trajectory: step\n done").json()["choices"][0]["message"]["content"] == "verdict"
    assert _ask(mock_openai, "x").json()["choices"][0]["message"]["content"] == "echo x"
    assert _ask(mock_openai, "y").json()["choices"][0]["message"]["content"] == "echo y"
    assert [r.last_user for r in mock_openai.requests][:2] == ["hi", "Trajectory: step\n done"]
    assert mock_openai.requests[0].stage == "db" and mock_openai.requests[0].messages[0]["content"] == "sys"


def test_errors_raw_bodies_and_unmatched(mock_openai: MockOpenAI) -> None:
    mock_openai.script(Reply.error(429), Reply.error(500), Reply(raw_body="not json"), '{"broken": ')
    assert _ask(mock_openai, "a").status_code == 429
    assert _ask(mock_openai, "a").status_code == 500
    assert _ask(mock_openai, "a").text == "not json"
    assert _ask(mock_openai, "a").json()["choices"][0]["message"]["content"] == '{"broken": '
    res = _ask(mock_openai, "nothing left")
    assert res.status_code == 400 and "no scripted reply" in res.text
    assert len(mock_openai.unmatched) == 1


def test_latency_is_applied_per_request() -> None:
    with MockOpenAI(latency_s=0.2) as mock:
        mock.script("slow")
        t0 = time.perf_counter()
        _ask(mock, "a")
        assert time.perf_counter() - t0 >= 0.2


def test_openai_sdk_talks_to_it_and_it_stops(mock_openai: MockOpenAI) -> None:
    mock_openai.script("from the sdk")
    client = openai.OpenAI(base_url=mock_openai.url, api_key="k", max_retries=0)
    out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    assert out.choices[0].message.content == "from the sdk" and out.usage.total_tokens > 0
    client.close()
    mock = MockOpenAI().start()
    url = mock.url
    mock.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{url}/chat/completions", json={})
