"""``envfarm learn`` on the LLM-judge reward path, against a MOCK judge model.

    python benchmarks/trainer/learn_judge.py --config trainer/configs/learn_cpu.yaml --seed 0 --out-dir runs/learn_judge_s0
    python benchmarks/trainer/learn_judge.py --seed 0 --start-from runs/learn_s0/model_sft --out-dir runs/learn_judge_s0

The same run as ``envfarm learn`` (suite, SFT, evaluations by the farm's code verifier), except
that GRPO's rewards come from the paper's code-augmented LLM judge (``grpo.reward_path: llm``,
``trainer/judging.py``): each finished episode's databases, trajectory and verifier go to a judge
in the trainer process, whose model is the local mock OpenAI server (tests/fakes/mock_openai.py).
No LLM runs here, so the mock reads what a judge model would read and answers the way a faithful
one would (``tests/fakes/faithful_judge.py``): the task's criteria applied to the facts of its
sql-mode verifier (``synth.factory.sql_verifier``) in ``<verification_json>``, "Completed" when
no check failed and the final answer states the expected answer (where one is given) and no
other candidate, "Agent Error" otherwise. What this exercises is the judge path in the loop
(databases taken, lease released, judged while rollouts go on, verdicts settled before the
update), not a model's judgment. ``learn.json`` records ``"judge": "mock"`` and the judge requests it answered.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.fakes.faithful_judge import verdict_of  # noqa: E402
from tests.fakes.mock_openai import MockOpenAI  # noqa: E402


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
