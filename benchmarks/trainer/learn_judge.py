"""``envfarm learn`` on the LLM-judge reward path, against a MOCK judge model.

    python benchmarks/trainer/learn_judge.py --config trainer/configs/learn_cpu.yaml --seed 0 --out-dir runs/learn_judge_s0
    python benchmarks/trainer/learn_judge.py --seed 0 --start-from runs/learn_s0/model_sft --out-dir runs/learn_judge_s0

The same run as ``envfarm learn`` (suite, SFT, evaluations by the farm's code verifier), except
that GRPO's rewards come from the paper's code-augmented LLM judge (``grpo.reward_path: llm``,
``trainer/judging.py``): each finished episode's databases, trajectory and verifier go to a judge
in the trainer process, whose model is the local mock OpenAI server (tests/fakes/mock_openai.py).
No LLM runs here, so the mock reads what a judge model would read and answers the way a faithful
one would: "Completed" when the facts of the task's sql-mode verifier (``synth.factory.sql_verifier``)
in ``<verification_json>`` show every check passed, "Agent Error" otherwise. What this exercises is the judge path in the loop (databases
taken, lease released, judged while rollouts go on, verdicts settled before the update), not a
model's judgment. ``learn.json`` records ``"judge": "mock"`` and the judge requests it answered.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from synth.factory.verifier import states  # noqa: E402
from tests.fakes.mock_openai import MockOpenAI, SeenRequest  # noqa: E402


def verdict_of(req: SeenRequest) -> str:
    """The faithful mock judge, the task's criteria (``synth.factory.sql_verifier.CRITERIA``)
    applied to the sql-mode verifier's facts: Completed when no check failed, and where an
    expected answer is given, the final answer states it (``states``: the code-mode verifier's
    rule) and none of the other candidates. A read-only chain has no checks at all (nothing may
    change, nothing did): its answer decides."""
    text = req.last_user
    task = json.loads(text.split("<task_json>\n", 1)[1].split("\n</task_json>", 1)[0])
    block = text.split("<verification_json>\n", 1)[1].split("\n</verification_json>", 1)[0]
    facts = json.loads(block).get("code_execution_result") or {}
    done = facts.get("failed") == 0 and (bool(facts.get("passed")) or "expected_answer" in facts)
    if "expected_answer" in facts:
        answer = str(task.get("final_answer") or "")
        done = (done and states(answer, facts["expected_answer"])
                and not any(states(answer, o) for o in facts.get("other_candidates") or []))
    label = "Completed" if done else "Agent Error"
    return json.dumps({"reasoning": f"{facts.get('passed')} checks passed, {facts.get('failed')} failed",
                       "classification": label, "confidence": 0.9, "evidence": {"checks": facts.get("checks")}})


def main() -> None:
    from cluster.compose import LocalFarm
    from envfarm.farm import FarmConfig, PoolConfig
    from trainer.learn import LearnConfig, prepare, run

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=REPO / "trainer" / "configs" / "learn_cpu.yaml")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--start-from", type=Path, default=None,
                    help="a learn run's model_sft: GRPO (on the judge path) from it, no warm-up or SFT")
    args = ap.parse_args()
    overrides = {"seed": args.seed, "out_dir": str(args.out_dir) if args.out_dir else None,
                 "threads": args.threads, "start_from": str(args.start_from) if args.start_from else None}
    cfg = LearnConfig.from_yaml(args.config, **overrides)
    suite = prepare(cfg)
    with MockOpenAI() as judge:
        judge.script(verdict_of, stage="judge", repeat=True)
        cfg = cfg.model_copy(update={"grpo": {**cfg.grpo, "reward_path": "llm", "judge_base_url": judge.url,
                                              "judge_model": "mock-judge"}})
        with LocalFarm(FarmConfig(catalog=str(suite.catalog), envs=suite.envs, pool=PoolConfig(warm=16))) as farm:
            report = run(cfg, farm.url, suite, log=lambda line: print(line, flush=True))
        answered = len(judge.requests_for(stage="judge"))
    report.update(judge="mock (benchmarks/learn_judge.py: Completed iff the verifier says complete)",
                  judge_requests=answered)
    path = Path(cfg.out_dir) / "learn.json"
    path.write_text(json.dumps(report, indent=1))
    print(json.dumps({"judge_requests": answered, "report": str(path)}))


if __name__ == "__main__":
    main()
