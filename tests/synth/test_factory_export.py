"""``synth export``: accepted episodes as catalog tasks the farm leases and verifies, and SFT JSONL
(OpenAI messages + tools, the trainer's Qwen3 format) that HF ``datasets`` loads."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cluster.compose import compose_core
from envfarm import load_catalog
from envfarm.client import ASGITransport, Farm, reference_episode
from envfarm.farm import FarmConfig, PoolConfig, build_app
from synth._jsonl import read_jsonl
from synth.factory.export import CATALOG_DIR, MAP_FILE, SFT_DIR
from synth.factory.graph import factory_dir
from synth.factory.queries import EPISODES_FILE
from tests.envfarm.farm.conftest import lifespan_running
from tests.synth.factory_run import ENV, prepare_run, queries_args, script_queries
from trainer.format import parse_assistant


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A run folder after graph, chains, queries (mock LLM) and export through ``envfarm synth``."""
    from cluster.cli import app
    from tests.fakes.mock_openai import MockOpenAI

    out = tmp_path_factory.mktemp("run")
    prepare_run(out, n=8)
    run = CliRunner()
    with MockOpenAI() as mock:
        script_queries(mock)
        res = run.invoke(app, ["synth", *queries_args(mock, out)], catch_exceptions=False)
        assert res.exit_code == 0, res.output
    res = run.invoke(app, ["synth", "export", "--out", str(out), "--env", ENV], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    accepted = [r for r in read_jsonl(factory_dir(out, ENV) / EPISODES_FILE) if r["accepted"]]
    assert accepted
    return out, accepted


def test_exported_catalog_holds_the_tasks(exported) -> None:
    out, accepted = exported
    original = load_catalog()[ENV]
    bundle = load_catalog(out / CATALOG_DIR)[ENV]
    first = len(original.tasks)
    assert len(bundle.tasks) == first + len(accepted) and bundle.tasks[:first] == original.tasks
    assert bundle.problems == original.problems  # nothing broken by the appended records
    mapping = read_jsonl(out / CATALOG_DIR / ENV / MAP_FILE)
    assert [m["chain_id"] for m in mapping] == [e["chain_id"] for e in accepted]
    for i, ep in enumerate(accepted):
        idx = first + i
        assert bundle.code_verifiers[idx].code == ep["verifier_code"]
        assert [c.tool for c in bundle.solutions[idx]] == [c["tool"] for c in ep["calls"]]
        assert bundle.solution_answers.get(idx) == ep["final_answer"]
        assert bundle.tasks[idx] == "\n\n".join(ep["messages"])


async def test_farm_leases_and_verifies_an_exported_task(exported) -> None:
    out, accepted = exported
    catalog = load_catalog(out / CATALOG_DIR)
    bundle = catalog[ENV]
    first = len(load_catalog()[ENV].tasks)
    core = compose_core(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1, max_instances=2)), catalog=catalog)
    app = build_app(core)
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app)) as farm:
        for idx in range(first, first + len(accepted)):
            report = await reference_episode(farm, ENV, idx, bundle.solutions[idx], bundle.solution_answers.get(idx))
            assert report.task == bundle.tasks[idx]
            assert report.verdict.reward == 1.0, (idx, report.verdict)
        noop = await farm.acquire(ENV, task_idx=first)
        try:
            verdict = await noop.verify()
        finally:
            await noop.release()
        assert verdict.reward == 0.0


def test_sft_jsonl_loads_with_datasets(exported, tmp_path) -> None:
    import datasets
    out, accepted = exported
    files = {fmt: str(out / SFT_DIR / f"{fmt}.jsonl") for fmt in ("openai", "qwen3")}
    openai = datasets.load_dataset("json", data_files=files["openai"], split="train", cache_dir=str(tmp_path))
    qwen = datasets.load_dataset("json", data_files=files["qwen3"], split="train", cache_dir=str(tmp_path))
    assert len(openai) == len(qwen) == len(accepted)
    row = openai[0]
    calls = [m for m in row["messages"] if m["role"] == "assistant" and m.get("tool_calls")]
    assert [c["tool_calls"][0]["function"]["name"] for c in calls] == [c["tool"] for c in accepted[0]["calls"]]
    assert {t["function"]["name"] for t in row["tools"]} >= {c["tool"] for c in accepted[0]["calls"]}
    q = qwen[0]
    system, rest = q["text"].split("<|im_end|>", 1)
    assert system.startswith("<|im_start|>system\n") and rest.count("<tool_call>") == len(accepted[0]["calls"]) + 1
    turns = [parse_assistant(m["content"]) for m in q["messages"] if m["role"] == "assistant"]
    assert turns[0].call.name == "list_tools"
    called = [json.loads(t.call.arguments["arguments"]) for t in turns[1:] if t.call]
    assert called == [c["arguments"] for c in accepted[0]["calls"]]
    assert turns[-1].kind.value == "final"


def _nulls(value, path="") -> list[str]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _nulls(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _nulls(v, f"{path}[{i}]")]
    return [path] if value is None else []


def test_openai_records_fit_openais_schema(exported) -> None:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
    from pydantic import TypeAdapter

    out, accepted = exported
    records = read_jsonl(out / SFT_DIR / "openai.jsonl")
    assert len(records) == len(accepted)
    messages, tools = TypeAdapter(list[ChatCompletionMessageParam]), TypeAdapter(list[ChatCompletionToolParam])
    for rec in records:
        assert not _nulls(rec["messages"]) and not _nulls(rec["tools"])
        messages.validate_python(rec["messages"], strict=True)
        tools.validate_python(rec["tools"], strict=True)
        roles = [m["role"] for m in rec["messages"]]
        assert roles[0] == "user" and roles[-1] == "assistant"
        for m in rec["messages"]:  # each message carries only its role's keys
            assert set(m) <= {"user": {"role", "content"}, "tool": {"role", "content", "tool_call_id"},
                              "assistant": {"role", "content", "tool_calls"}}[m["role"]]
        calls = [m["tool_calls"][0]["id"] for m in rec["messages"] if "tool_calls" in m]
        assert calls == [m["tool_call_id"] for m in rec["messages"] if m["role"] == "tool"]


def test_export_is_idempotent_and_keeps_other_envs(exported) -> None:
    from cluster.cli import app

    out, _ = exported
    path = out / SFT_DIR / "openai.jsonl"
    other = {"env": "another_env_1", "chain_id": "x", "messages": [{"role": "user", "content": "hi"}], "tools": []}
    path.write_text(path.read_text() + json.dumps(other) + "\n")
    before = {p.name: p.read_bytes() for p in (out / SFT_DIR).iterdir()}
    res = CliRunner().invoke(app, ["synth", "export", "--out", str(out), "--env", ENV], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    after = {p.name: p.read_bytes() for p in (out / SFT_DIR).iterdir()}
    assert after["qwen3.jsonl"] == before["qwen3.jsonl"]
    records = read_jsonl(path)
    assert other in records and records[0] == other  # kept, in env order
    assert [r for r in records if r["env"] == ENV] == [r for r in map(json.loads, before["openai.jsonl"].splitlines())
                                                      if r["env"] == ENV]


def test_turns_follow_the_plan() -> None:
    from synth.factory.export import openai_record
    from synth.factory.model import Call, Episode

    calls = [Call(tool="list_books", arguments={}, result=[{"id": 1, "title": "Dune"}], changed=False),
             Call(tool="lend_book", arguments={"book_id": 1}, result={"loan_id": 3}, changed=True),
             Call(tool="get_book", arguments={"book_id": 1}, result={"title": "Dune"}, changed=False)]
    ep = Episode(env="lending_1", chain_id="c", calls=calls, messages=["What books are there?", "Lend Dune to me."],
                 turn_calls=[1, 2], verifier_code="", final_answer="The title is Dune.")
    msgs = openai_record(ep, "", [])["messages"]
    shape = [m["role"] + ("*" if "tool_calls" in m else "") for m in msgs]
    assert shape == ["user", "assistant*", "tool", "assistant", "user", "assistant*", "tool", "assistant*", "tool",
                     "assistant"]
    assert msgs[3]["content"] == "Done. The title is Dune."  # the first turn's answer, not a filler
    assert msgs[-1]["content"] == "The title is Dune."
