"""Synthesis throughput against the mock OpenAI endpoint with a fixed latency per call.

    python -m benchmarks.synth.bench_synth --scenarios 20 --latency 1.0 --concurrency 1 8 32

Every scenario gets the recorded answers of tests/fakes/synth_fixtures (library / recipes, alternating,
3 tasks each, one task per library env unsolvable and dropped by the gate). Stages task..verifier
run (the scenario list is pre-written). Reports envs completed per minute per concurrency, and the
cost of the validation work per env (a zero-latency run: wall and CPU seconds, sandbox included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from synth.config import SCENARIO_STAGES, SynthConfig  # noqa: E402
from envfarm.llm import LLMClient, LLMConfig  # noqa: E402
from synth.pipeline import run_pipeline  # noqa: E402
from tests.fakes.mock_openai import MockOpenAI, SeenRequest  # noqa: E402
from tests.fakes.synth_fixtures import library, recipes  # noqa: E402
from tests.fakes.scripted_synth import _fenced, _summary, _verifier_answer  # noqa: E402


def _fixture(req: SeenRequest):
    return library if req.scenario.startswith("library") else recipes


def script(mock: MockOpenAI) -> None:
    answers = {
        "task": lambda r: json.dumps({"tasks": _fixture(r).TASKS}),
        "db": lambda r: json.dumps({"tables": _fixture(r).TABLES}),
        "sample": lambda r: json.dumps({"tables": _fixture(r).SAMPLE}),
        "spec": lambda r: json.dumps(_fixture(r).SPEC),
        "env": lambda r: _fenced(_fixture(r).ENV_CODE),
    }
    for stage, fn in answers.items():
        mock.script(fn, stage=stage, repeat=True)
    for stage in ("db", "sample", "env", "verifier", "gate"):
        mock.script(_summary, stage=f"{stage}.fix", repeat=True)

    def verifier(r: SeenRequest) -> str:
        fx = _fixture(r)
        idx = next(i for i, t in enumerate(fx.TASKS) if t in r.prompt)
        return _verifier_answer(fx.VERIFIERS[idx]["sql"], fx.VERIFIERS[idx]["code"])

    def solution(r: SeenRequest) -> str:
        fx = _fixture(r)
        idx = next(i for i, t in enumerate(fx.TASKS) if f"Task: {t}" in r.prompt)
        return json.dumps({"solution": fx.SOLUTIONS[idx]})

    mock.script(verifier, stage="verifier", repeat=True)
    mock.script(solution, stage="gate", repeat=True)


def write_scenarios(out: Path, n: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gen_scenario.jsonl", "w") as fh:
        for i in range(n):
            fx = library if i % 2 == 0 else recipes
            cat = "library" if fx is library else "recipes"
            fh.write(json.dumps({"name": f"{cat}_{i // 2 + 1}", "description": fx.SCENARIO["description"]}) + "\n")


def _cpu() -> float:
    self_, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return self_.ru_utime + self_.ru_stime + kids.ru_utime + kids.ru_stime


async def one_run(mock: MockOpenAI, n: int, concurrency: int, root: Path) -> dict[str, float]:
    out = root / f"c{concurrency}_lat{mock.latency_s}"
    write_scenarios(out, n)
    config = SynthConfig(out_dir=out, tasks_per_scenario=3, concurrency=concurrency, gate_attempts=2,
                         progress=False, sandbox_workers=2)
    before_requests = len(mock.requests)
    cpu0, t0 = _cpu(), time.perf_counter()
    async with LLMClient(LLMConfig(base_url=mock.url, model="mock", max_concurrency=256)) as llm:
        summary = await run_pipeline(config, llm, SCENARIO_STAGES)
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    return {"concurrency": concurrency, "latency_s": mock.latency_s, "scenarios": n, "envs": summary.envs,
            "envs_solved": summary.envs_with_solvable_tasks, "wall_s": round(wall, 2),
            "envs_per_min": round(summary.envs / wall * 60, 2), "cpu_s": round(cpu, 2),
            "cpu_util": round(cpu / wall, 3), "llm_calls": len(mock.requests) - before_requests,
            "max_in_flight": mock.max_in_flight}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", type=int, default=20)
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, MockOpenAI(latency_s=0.0) as mock:
        script(mock)
        # Validation cost: zero LLM latency, one scenario at a time, so wall ~= validation work.
        base = await one_run(mock, args.scenarios, 1, Path(tmp))
        base["validation_wall_s_per_env"] = round(base["wall_s"] / max(1, base["envs"]), 3)
        base["validation_cpu_s_per_env"] = round(base["cpu_s"] / max(1, base["envs"]), 3)
        rows.append(base)
        print(json.dumps(base), flush=True)
        mock.latency_s = args.latency
        for c in args.concurrency:
            mock.max_in_flight = 0
            row = await one_run(mock, args.scenarios, c, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
