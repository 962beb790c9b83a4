"""Judge rewards with and without overlap: step time for 1,024 episodes per step (64 tasks x 16).

Rollouts are generation-bound in real training (the policy runs on GPUs), and this machine has
2 shared cores, so rollouts are *replayed*: each of the 30 bundled tasks is run once for real
(reference solution through the agent loop against an in-process farm; its trajectory and both
databases are kept), and a step's 1,024 episodes each hold a rollout slot (``--concurrency``)
for ``turns x --turn-latency`` seconds, as generation would. The judge is real: a judge
service (``judge.http`` on uvicorn, a subprocess: the sql-mode verifier in its sandbox, then the
LLM judge), whose model is a mock OpenAI endpoint (a subprocess) answering after ``--latency``
seconds. Two schedules, alternating round by round:

  sequential   collect all 1,024 rollouts, then judge them all
  overlap      each episode goes to the judge as it finishes, while the others still run
               (trainer/judging.py, what ``reward_path: llm`` does)

Reports rollout time, the judge tail after the last rollout, and the step time (no GRPO update:
it is the same in both). No Ray. Raw records: benchmarks/results/judge_overlap.json.

    .venv/bin/python benchmarks/judge/bench_judge_overlap.py                 # 200 ms and 2 s
    .venv/bin/python benchmarks/judge/bench_judge_overlap.py --quick         # 64 episodes, smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks._procs import wait_http
from envfarm import load_catalog
from envfarm.client import ASGITransport, Farm
from envfarm.compose import compose_core
from envfarm.farm import FarmConfig, PoolConfig, build_app, free_port
from judge import Judge, JudgeConfig, JudgeRequest
from trainer.episode import EpisodeConfig, run_episode
from trainer.judging import EpisodeJudge
from trainer.policy import ScriptedPolicy

PY = sys.executable
OUT = REPO / "benchmarks" / "results" / "judge_overlap.json"

JUDGE_SERVICE = """
import sys, uvicorn
from judge import Judge, JudgeConfig, SandboxConfig
from judge.http import create_app
from envfarm.llm import LLMClient, LLMConfig
client = LLMClient(LLMConfig(base_url=sys.argv[1], model="judge", max_concurrency=256))
judge = Judge(JudgeConfig(use_llm="always", sandbox=SandboxConfig(workers=2)), llm_client=client)
uvicorn.run(create_app(judge), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning",
            access_log=False)
"""

def start(args: list[str], health: str) -> subprocess.Popen:
    proc = subprocess.Popen([PY, *args], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_http(health)
    return proc


def start_mock(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([PY, str(REPO / "benchmarks" / "judge_mock_server.py"), str(latency)],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()  # type: ignore[union-attr]
    return proc, url


async def record_episodes(catalog: Any) -> list[tuple[int, JudgeRequest]]:
    """One real episode per bundled task: (assistant turns, its judge request)."""
    core = compose_core(FarmConfig(pool=PoolConfig(warm=1)), catalog=catalog)
    app = build_app(core)
    recorder = EpisodeJudge(catalog, judge=Judge(JudgeConfig(use_llm="never")), overlap=False)
    policy = ScriptedPolicy.from_catalog(catalog)
    out = []
    async with app.router.lifespan_context(app), Farm(
            "http://farm", transport=ASGITransport(app)) as farm:
        for env in catalog.servable:
            for idx in sorted(catalog[env].solutions):
                result = await run_episode(farm, policy, env, idx,
                                           config=EpisodeConfig(judge=recorder))
                ((request, _),) = recorder._held
                recorder._held.clear()
                out.append((len(result.turns), request))
    await recorder.aclose()
    return out


async def one_step(judge_url: str, jobs: list[tuple[int, JudgeRequest]], overlap: bool,
                   concurrency: int, turn_latency: float, catalog: Any) -> dict[str, Any]:
    judge = EpisodeJudge(catalog, url=judge_url, overlap=overlap)
    gate = asyncio.Semaphore(concurrency)

    async def rollout(turns: int, request: JudgeRequest) -> asyncio.Future:
        async with gate:  # the slot is held while the policy "generates"
            await asyncio.sleep(turns * turn_latency)
        return judge.submit_request(request)

    started = time.perf_counter()
    pending = await asyncio.gather(*(rollout(t, r) for t, r in jobs))
    rollout_s = time.perf_counter() - started
    judge.start_held()
    verdicts = await asyncio.gather(*pending)
    step_s = time.perf_counter() - started
    await judge.aclose()
    outcomes = Counter(v.outcome.value for v in verdicts)
    why_invalid = Counter(v.reason[:80] for v in verdicts if not v.valid)
    return {"schedule": "overlap" if overlap else "sequential", "episodes": len(jobs),
            "rollout_s": round(rollout_s, 2), "judge_tail_s": round(step_s - rollout_s, 2),
            "step_s": round(step_s, 2), "outcomes": dict(outcomes),
            "why_invalid": dict(why_invalid.most_common(5)),
            "load_avg_1m": round(os.getloadavg()[0], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency", type=float, nargs="+", default=[0.2, 2.0])
    ap.add_argument("--episodes", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=256, help="episodes in flight")
    ap.add_argument("--turn-latency", type=float, default=1.0, help="s per policy turn")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of both schedules")
    ap.add_argument("--quick", action="store_true", help="64 episodes, one round")
    ap.add_argument("--json", type=Path, default=None, help=f"where records go ({OUT})")
    args = ap.parse_args()
    if args.quick:
        args.episodes, args.rounds = 64, 1
    catalog = load_catalog()
    recorded = asyncio.run(record_episodes(catalog))
    groups = max(1, args.episodes // 16)
    jobs = [recorded[g % len(recorded)] for g in range(groups) for _ in range(16)]
    judge_port = free_port()
    records = []
    for latency in args.latency:
        mock, mock_url = start_mock(latency)
        service = start(["-c", JUDGE_SERVICE, mock_url, str(judge_port)],
                        f"http://127.0.0.1:{judge_port}/healthz")
        try:
            for rnd in range(args.rounds):
                for overlap in ((False, True) if rnd % 2 == 0 else (True, False)):
                    rec = asyncio.run(one_step(f"http://127.0.0.1:{judge_port}", jobs, overlap,
                                               args.concurrency, args.turn_latency, catalog))
                    rec.update(latency_s=latency, round=rnd, turn_latency_s=args.turn_latency,
                               concurrency=args.concurrency)
                    print(json.dumps(rec), flush=True)
                    records.append(rec)
        finally:
            for proc in (service, mock):
                proc.terminate()
                proc.wait(timeout=30)
    summary = {}
    for latency in args.latency:
        for schedule in ("sequential", "overlap"):
            steps = [r["step_s"] for r in records
                     if r["latency_s"] == latency and r["schedule"] == schedule]
            summary[f"{latency}s/{schedule}"] = statistics.median(steps)
        summary[f"{latency}s/speedup"] = round(summary[f"{latency}s/sequential"]
                                               / summary[f"{latency}s/overlap"], 2)
    print(json.dumps({"median_step_s": summary}))
    out = args.json or (None if args.quick else OUT)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(),
                                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                   "summary": summary, "records": records}, indent=1))


if __name__ == "__main__":
    main()
