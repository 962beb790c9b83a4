"""Stage 1: Self-Instruct scenario expansion, CRUD classifier, embedding dedup, category caps."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from envfarm.catalog import normalize_name
from envfarm.errors import SynthesisError
from synth import prompts
from synth._answers import ClassifierAnswer, ScenarioCandidate, parse_answer, validate_answer
from synth._context import Meter, RunContext
from synth._jsonl import read_jsonl
from synth._parse import ParseError, extract_json
from synth.embed import cosine_matrix
from synth.report import StageReport


def load_seeds(path: Path | None) -> list[dict[str, str]]:
    """Seed scenarios ``{name, description}``: a file, or the list shipped with the package."""
    if path is None:
        text = resources.files("synth").joinpath("data/seed_scenarios.jsonl").read_text()
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        if not Path(path).exists():
            raise SynthesisError(f"seed file {path} does not exist")
        records = read_jsonl(Path(path))
    seeds = [{"name": str(r["name"]), "description": str(r.get("description", ""))} for r in records if r.get("name")]
    if not seeds:
        raise SynthesisError(f"seed file {path or '(packaged)'} holds no scenarios")
    return seeds


def _candidates(raw: Any) -> list[dict[str, Any]]:
    """The well-formed proposals of a generation answer (each with a name and a description)."""
    out = []
    for item in raw if isinstance(raw, list) else []:
        try:
            out.append(validate_answer(item, ScenarioCandidate).model_dump(exclude_none=True))
        except ParseError:
            continue  # one malformed proposal does not spoil the others
    return out


def _text(rec: dict[str, Any]) -> str:
    return f"{rec.get('source_name') or rec['name']}: {rec.get('description', '')}"


async def scenario_stream(ctx: RunContext) -> AsyncIterator[dict[str, Any]]:
    """Yield accepted scenario records (those of an earlier run first) until ``target_count``."""
    cfg = ctx.config
    store = ctx.stores.scenario
    accepted: list[dict[str, Any]] = list(store)
    for rec in accepted:
        yield rec
    if len(accepted) >= cfg.target_count:
        return
    seeds = load_seeds(cfg.seed_file)
    seen_names = {normalize_name(s["name"]) for s in seeds}
    seen_names |= {normalize_name(r.get("source_name") or r["name"]) for r in accepted}
    ref_texts = [_text(s) for s in seeds] + [_text(r) for r in accepted]
    ref_vecs = await ctx.embedder.embed(ref_texts) if ctx.embedder else None
    cap = max(1, math.ceil(cfg.target_count * cfg.category_share))
    threshold = cfg.dedup_threshold
    per_category = Counter(r.get("category", "other") for r in accepted)
    stalled = 0
    for round_idx in range(cfg.max_rounds):
        if len(accepted) >= cfg.target_count:
            return
        meter = Meter()
        rng = random.Random(round_idx)
        pool = seeds + [{"name": r.get("source_name") or r["name"], "description": r["description"]} for r in accepted]
        examples = rng.sample(pool, min(cfg.seeds_in_prompt, len(pool)))
        verdicts: list[tuple[dict[str, Any], bool, str, dict[str, Any]]] = []
        try:
            gen = extract_json(await ctx.chat(
                meter, prompts.scenario_generate(examples, cfg.candidates_per_round, sorted(seen_names)),
                stage="scenario", scenario=None, salt=f"round-{round_idx}"))
            candidates = _candidates(gen.get("scenarios"))
            if not candidates:
                raise ParseError("no scenarios in the answer")
            cls = parse_answer(await ctx.chat(meter, prompts.scenario_classify(candidates),
                                              stage="scenario.classify", scenario=None, temperature=0.0),
                               ClassifierAnswer)
            by_index = {r.index: r.model_dump() for r in cls.results}
        except ParseError as exc:
            ctx.record(meter.report(stage="scenario", scenario=f"_round_{round_idx}", ok=False, attempts=1,
                                    errors=[f"unusable LLM answer: {exc}"]))
            stalled += 1
            continue
        vecs = await ctx.embedder.embed([_text(c) for c in candidates]) if ctx.embedder else None
        added = 0
        for i, cand in enumerate(candidates):
            source = normalize_name(str(cand["name"]))
            verdict = by_index.get(i, {})
            category = normalize_name(str(verdict.get("category") or cand.get("category") or "other")) or "other"
            details: dict[str, Any] = {"source_name": cand["name"], "category": category, "round": round_idx}
            reason = ""
            if source in seen_names:
                reason = "duplicate name"
            elif not verdict:
                reason = "classifier gave no verdict"
            elif not verdict["crud_suitable"]:
                reason = f"not CRUD-suitable: {verdict.get('reason', '')}"
            elif per_category[category] >= cap:
                reason = f"category cap reached ({category}: {cap})"
            elif vecs is not None and ref_vecs is not None and len(ref_vecs):
                sim = float(cosine_matrix(vecs[i : i + 1], ref_vecs).max())
                details["max_similarity"] = round(sim, 4)
                if sim >= threshold:
                    reason = f"near-duplicate (cosine {sim:.3f} >= {threshold:.2f})"
            seen_names.add(source)
            verdicts.append((cand, not reason, reason, details))
            if reason:
                continue
            n = per_category[category] + 1
            while f"{category}_{n}" in store:
                n += 1
            rec = {"name": f"{category}_{n}", "description": str(cand["description"]), "category": category,
                   "source_name": str(cand["name"]), "crud_suitable": True,
                   "classifier_reason": str(verdict.get("reason", ""))}
            if store.append_once(rec):
                accepted.append(rec)
                per_category[category] += 1
                added += 1
                if vecs is not None:
                    ref_vecs = np.vstack([ref_vecs, vecs[i : i + 1]]) if ref_vecs is not None else vecs[i : i + 1]
                details["name"] = rec["name"]
                yield rec
                if len(accepted) >= cfg.target_count:
                    break
        share = 1.0 / max(1, len(verdicts))
        for cand, ok, reason, details in verdicts:
            rep = meter.report(stage="scenario", scenario=details.get("name") or f"_rejected_{normalize_name(str(cand['name']))}",
                               ok=ok, attempts=1, errors=[reason] if reason else [], details=details)
            rep.prompt_tokens = int(rep.prompt_tokens * share)
            rep.completion_tokens = int(rep.completion_tokens * share)
            rep.cost_usd *= share
            rep.llm_calls = 0
            ctx.record(rep)
        stalled = 0 if added else stalled + 1
        if stalled >= cfg.stall_rounds:
            # Relaxation: widen the category cap first; loosen dedup a little, never past 0.95.
            cap = cap + max(1, cap // 2)
            threshold = min(0.95, threshold + 0.03)
            stalled = 0
            ctx.record(StageReport(stage="scenario.relax", scenario=f"_relax_{round_idx}", ok=True, attempts=0,
                                   details={"category_cap": cap, "dedup_threshold": threshold, "relaxation": True}))
    if len(accepted) < cfg.target_count:
        ctx.record(StageReport(stage="scenario", scenario="_target", ok=False, attempts=cfg.max_rounds,
                               errors=[f"only {len(accepted)} of {cfg.target_count} scenarios after {cfg.max_rounds} rounds"]))
