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


class _Rounds:
    """What scenario generation keeps across rounds: the records accepted, the names and
    embeddings seen, and the category cap and dedup threshold (relaxed when rounds stall)."""

    def __init__(self, ctx: RunContext, seeds: list[dict[str, str]], accepted: list[dict[str, Any]],
                 ref_vecs: Any) -> None:
        cfg = ctx.config
        self.ctx, self.store, self.seeds, self.accepted = ctx, ctx.stores.scenario, seeds, accepted
        self.seen_names = {normalize_name(s["name"]) for s in seeds}
        self.seen_names |= {normalize_name(r.get("source_name") or r["name"]) for r in accepted}
        self.ref_vecs = ref_vecs
        self.cap = max(1, math.ceil(cfg.target_count * cfg.category_share))
        self.threshold = cfg.dedup_threshold
        self.per_category = Counter(r.get("category", "other") for r in accepted)
        self.stalled = 0

    async def ask(self, round_idx: int, meter: Meter) -> tuple[list[dict[str, Any]], dict[int, Any]] | None:
        """This round's candidates and the classifier's verdict on each, by index; None (recorded)
        when an answer is unusable."""
        cfg, ctx = self.ctx.config, self.ctx
        rng = random.Random(round_idx)
        pool = self.seeds + [{"name": r.get("source_name") or r["name"], "description": r["description"]}
                             for r in self.accepted]
        examples = rng.sample(pool, min(cfg.seeds_in_prompt, len(pool)))
        try:
            gen = extract_json(await ctx.chat(
                meter, prompts.scenario_generate(examples, cfg.candidates_per_round, sorted(self.seen_names)),
                stage="scenario", scenario=None, salt=f"round-{round_idx}"))
            candidates = _candidates(gen.get("scenarios"))
            if not candidates:
                raise ParseError("no scenarios in the answer")
            cls = parse_answer(await ctx.chat(meter, prompts.scenario_classify(candidates),
                                              stage="scenario.classify", scenario=None, temperature=0.0),
                               ClassifierAnswer)
            return candidates, {r.index: r.model_dump() for r in cls.results}
        except ParseError as exc:
            ctx.record(meter.report(stage="scenario", scenario=f"_round_{round_idx}", ok=False, attempts=1,
                                    errors=[f"unusable LLM answer: {exc}"]))
            return None

    def reject(self, cand: dict[str, Any], verdict: dict[str, Any], vec: Any, round_idx: int
               ) -> tuple[str, dict[str, Any]]:
        """Why a candidate is turned down ("" if it is not), and what was found on the way."""
        source = normalize_name(str(cand["name"]))
        category = normalize_name(str(verdict.get("category") or cand.get("category") or "other")) or "other"
        details: dict[str, Any] = {"source_name": cand["name"], "category": category, "round": round_idx}
        reason = ""
        if source in self.seen_names:
            reason = "duplicate name"
        elif not verdict:
            reason = "classifier gave no verdict"
        elif not verdict["crud_suitable"]:
            reason = f"not CRUD-suitable: {verdict.get('reason', '')}"
        elif self.per_category[category] >= self.cap:
            reason = f"category cap reached ({category}: {self.cap})"
        elif vec is not None and self.ref_vecs is not None and len(self.ref_vecs):
            sim = float(cosine_matrix(vec, self.ref_vecs).max())
            details["max_similarity"] = round(sim, 4)
            if sim >= self.threshold:
                reason = f"near-duplicate (cosine {sim:.3f} >= {self.threshold:.2f})"
        self.seen_names.add(source)
        return reason, details

    def accept(self, cand: dict[str, Any], verdict: dict[str, Any], category: str, vec: Any
               ) -> dict[str, Any] | None:
        """The candidate stored as a scenario record; None when the store has it already."""
        n = self.per_category[category] + 1
        while f"{category}_{n}" in self.store:
            n += 1
        rec = {"name": f"{category}_{n}", "description": str(cand["description"]), "category": category,
               "source_name": str(cand["name"]), "crud_suitable": True,
               "classifier_reason": str(verdict.get("reason", ""))}
        if not self.store.append_once(rec):
            return None
        self.accepted.append(rec)
        self.per_category[category] += 1
        if vec is not None:
            self.ref_vecs = np.vstack([self.ref_vecs, vec]) if self.ref_vecs is not None else vec
        return rec

    def record(self, meter: Meter, verdicts: list[tuple[dict[str, Any], bool, str, dict[str, Any]]]) -> None:
        """One report per candidate of the round, each with its share of the round's LLM cost."""
        share = 1.0 / max(1, len(verdicts))
        for cand, ok, reason, details in verdicts:
            rep = meter.report(stage="scenario", scenario=details.get("name") or f"_rejected_{normalize_name(str(cand['name']))}",
                               ok=ok, attempts=1, errors=[reason] if reason else [], details=details)
            rep.prompt_tokens = int(rep.prompt_tokens * share)
            rep.completion_tokens = int(rep.completion_tokens * share)
            rep.cost_usd *= share
            rep.llm_calls = 0
            self.ctx.record(rep)

    def after(self, round_idx: int, added: int) -> None:
        self.stalled = 0 if added else self.stalled + 1
        if self.stalled >= self.ctx.config.stall_rounds:
            # Relaxation: widen the category cap first; loosen dedup a little, never past 0.95.
            self.cap = self.cap + max(1, self.cap // 2)
            self.threshold = min(0.95, self.threshold + 0.03)
            self.stalled = 0
            self.ctx.record(StageReport(stage="scenario.relax", scenario=f"_relax_{round_idx}", ok=True, attempts=0,
                                        details={"category_cap": self.cap, "dedup_threshold": self.threshold,
                                                 "relaxation": True}))


async def scenario_stream(ctx: RunContext) -> AsyncIterator[dict[str, Any]]:
    """Yield accepted scenario records (those of an earlier run first) until ``target_count``."""
    cfg = ctx.config
    accepted: list[dict[str, Any]] = list(ctx.stores.scenario)
    for rec in accepted:
        yield rec
    if len(accepted) >= cfg.target_count:
        return
    seeds = load_seeds(cfg.seed_file)
    ref_texts = [_text(s) for s in seeds] + [_text(r) for r in accepted]
    rounds = _Rounds(ctx, seeds, accepted, await ctx.embedder.embed(ref_texts) if ctx.embedder else None)
    for round_idx in range(cfg.max_rounds):
        if len(accepted) >= cfg.target_count:
            return
        meter = Meter()
        asked = await rounds.ask(round_idx, meter)
        if asked is None:
            rounds.stalled += 1
            continue
        candidates, by_index = asked
        vecs = await ctx.embedder.embed([_text(c) for c in candidates]) if ctx.embedder else None
        verdicts: list[tuple[dict[str, Any], bool, str, dict[str, Any]]] = []
        added = 0
        for i, cand in enumerate(candidates):
            verdict, vec = by_index.get(i, {}), None if vecs is None else vecs[i : i + 1]
            reason, details = rounds.reject(cand, verdict, vec, round_idx)
            verdicts.append((cand, not reason, reason, details))
            if reason:
                continue
            rec = rounds.accept(cand, verdict, details["category"], vec)
            if rec is not None:
                added += 1
                details["name"] = rec["name"]
                yield rec
                if len(accepted) >= cfg.target_count:
                    break
        rounds.record(meter, verdicts)
        rounds.after(round_idx, added)
    if len(accepted) < cfg.target_count:
        ctx.record(StageReport(stage="scenario", scenario="_target", ok=False, attempts=cfg.max_rounds,
                               errors=[f"only {len(accepted)} of {cfg.target_count} scenarios after {cfg.max_rounds} rounds"]))
