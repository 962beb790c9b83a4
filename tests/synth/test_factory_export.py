"""``synth export``: accepted episodes as catalog tasks the farm leases and verifies, and SFT JSONL
(OpenAI messages + tools, the trainer's Qwen3 format) that HF ``datasets`` loads."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from envfarm import load_catalog
from envfarm.client import ASGITransport, Farm, reference_episode
from envfarm.compose import compose_core
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
    from envfarm.cli import app
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
    calls = [m for m in row["messages"] if m["role"] == "assistant" and m["tool_calls"]]
    assert [c["tool_calls"][0]["function"]["name"] for c in calls] == [c["tool"] for c in accepted[0]["calls"]]
    assert {t["function"]["name"] for t in json.loads(row["tools"])} >= {c["tool"] for c in accepted[0]["calls"]}
    q = qwen[0]
    system, rest = q["text"].split("<|im_end|>", 1)
    assert system.startswith("<|im_start|>system\n") and rest.count("<tool_call>") == len(accepted[0]["calls"]) + 1
    turns = [parse_assistant(m["content"]) for m in q["messages"] if m["role"] == "assistant"]
    assert turns[0].call.name == "list_tools"
    called = [json.loads(t.call.arguments["arguments"]) for t in turns[1:] if t.call]
    assert called == [c["arguments"] for c in accepted[0]["calls"]]
    assert turns[-1].kind.value == "final"
