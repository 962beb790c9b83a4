"""Code-only vs code-augmented LLM judge on the bundled tasks: verdicts side by side.

For every bundled task with a reference solution, four scripted trajectories are played on a
fresh instance (real tool calls, real databases) and judged on both reward paths:

  good         the whole reference solution
  partial      the reference solution without its last call (tasks with 3 calls or more)
  bad          only the first call of the reference solution (then "The task is done.")
  env_broken   the partial episode whose last call answers HTTP 500 (the env failed the agent)

  code path    format rules, then the task's code-mode verifier decides (``complete``/``others``)
  judge path   format rules, then the sql-mode verifier's output, the trajectory and the
               criteria go to the judge model, over HTTP

The judge model is **scripted** (a mock OpenAI endpoint): it decodes the prompt the judge built
and answers from the trajectory in it, as an oracle would: Environment Error if a tool result
carries an env error, else Completed when every call of the reference solution was made and
succeeded, Partially Completed when more than half were, else Agent Error. It stands in for a
judge model to show how the two paths score the same episodes; it says nothing about how well
a real model judges.

    .venv/bin/python benchmarks/judge/bench_judge_agreement.py     # table + benchmarks/results/judge_agreement.json
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from envfarm import EnvRuntime, load_catalog
from envfarm.llm import LLMClient, LLMConfig
from judge import Judge, JudgeConfig, Message, Trajectory, VerifierCode, VerifierSandbox
from tests.fakes.mock_openai import MockOpenAI, SeenRequest
from trainer.format import call_tool_text, final_text, tool_call_text, tool_content

OUT = REPO / "benchmarks" / "results" / "judge_agreement.json"
KINDS = ("good", "partial", "bad", "env_broken")
INTENDED = {"good": "completed", "partial": "partially_completed", "bad": "agent_error",
            "env_broken": "environment_error"}


async def play(runtime: EnvRuntime, task: str, calls: list[Any], answer: str,
         broken_last: Any = None) -> tuple[Trajectory, bytes, bytes]:
    """Run ``calls`` on a fresh instance, written down as the agent loop would."""
    inst = runtime.instance()
    tools = [t.model_dump() if hasattr(t, "model_dump") else {"name": t.name} for t in inst.tools]
    msgs = [Message(role="system", content="You are a tool-use agent."),
            Message(role="user", content=task),
            Message(role="assistant", content=tool_call_text("list_tools", {}, "List first.")),
            Message(role="tool", content=tool_content(True, tools, max_chars=1 << 30))]
    for n, call in enumerate(calls, 1):
        res = await inst.call(call.tool, call.arguments)
        msgs.append(Message(role="assistant", content=call_tool_text(
            call.tool, call.arguments, f"Step {n}: {call.tool}.")))
        err = res.error.model_dump() if res.error else None
        msgs.append(Message(role="tool", content=tool_content(res.ok, res.result, err)))
    if broken_last is not None:
        msgs.append(Message(role="assistant", content=call_tool_text(
            broken_last.tool, broken_last.arguments, "Last step.")))
        msgs.append(Message(role="tool", content=tool_content(
            False, error={"kind": "env_error", "message": "Internal Server Error"}, status=500)))
    msgs.append(Message(role="assistant", content=final_text(answer, "All done, I think.")))
    traj = Trajectory(task=task, messages=msgs, final_answer=answer, max_turns=20)
    initial, final = inst.initial_snapshot(), inst.snapshot()
    inst.close()
    return traj, initial, final


def scripted_judge(references: dict[str, list[Any]]):
    """The oracle judge model: reads the prompt's task_json, compares with the reference."""

    def reply(req: SeenRequest) -> str:
        user = req.last_user
        task_json = json.loads(user.split("<task_json>\n", 1)[1].split("\n</task_json>", 1)[0])
        steps = task_json["trajectory"]
        ref = references[task_json["user_task"]]
        made = []
        steps = [s for s in steps if isinstance(s, dict)]  # a cut is marked by a string
        for i, step in enumerate(steps):
            if step.get("error_kind") == "env_error":
                return _answer("Environment Error", "a tool answered with a server error")
            if step.get("tool_call") == "call_tool" and i + 1 < len(steps) and "error_kind" \
                    not in steps[i + 1]:
                args = step["arguments"]
                made.append((args["tool_name"], json.loads(args.get("arguments") or "{}")))
        done = sum(1 for c in ref if (c.tool, c.arguments) in made)
        if done == len(ref):
            return _answer("Completed", "every required call was made and succeeded")
        if done > len(ref) / 2:
            return _answer("Partially Completed", f"{done} of {len(ref)} required calls")
        return _answer("Agent Error", f"only {done} of {len(ref)} required calls")

    return reply


def _answer(classification: str, why: str) -> str:
    return json.dumps({"reasoning": why, "classification": classification, "confidence": 1.0})


async def main() -> None:
    catalog = load_catalog()
    references = {catalog[e].tasks[i]: calls for e in catalog.servable
                  for i, calls in catalog[e].solutions.items()}
    rows = []
    with MockOpenAI() as mock, VerifierSandbox(workers=2) as sandbox:
        mock.script(scripted_judge(references), repeat=True)
        client = LLMClient(LLMConfig(base_url=mock.url, model="scripted-judge", max_retries=0))
        code_judge = Judge(JudgeConfig(use_llm="never"), sandbox=sandbox)
        llm_judge = Judge(JudgeConfig(use_llm="always"), llm_client=client, sandbox=sandbox)
        for env in catalog.servable:
            bundle = catalog[env]
            runtime = EnvRuntime(bundle)
            for idx, calls in sorted(bundle.solutions.items()):
                task = bundle.tasks[idx]
                plays = {"good": (calls, bundle.solution_answers.get(idx, "The task is done."),
                                  None),
                         "bad": (calls[:1], "The task is done.", None)}
                if len(calls) >= 3:
                    plays["partial"] = (calls[:-1], "The task is done.", None)
                    plays["env_broken"] = (calls[:-1], "The task is done.", calls[-1])
                sql, code = bundle.verifiers[idx], bundle.code_verifiers[idx]
                for kind, (done, answer, broken) in plays.items():
                    traj, initial, final = await play(runtime, task, done, answer, broken)
                    by_code = await code_judge.verify(code.code, initial, final, trajectory=traj)
                    by_llm = await llm_judge.verify(
                        VerifierCode(code=sql.code, raw_response=sql.raw_response, mode="sql"),
                        initial, final, trajectory=traj, scenario=env)
                    rows.append({"env": env, "task_idx": idx, "kind": kind,
                                 "code": by_code.outcome.value, "code_reward": by_code.reward,
                                 "judge": by_llm.outcome.value, "judge_reward": by_llm.reward})
        await llm_judge.aclose()
    table = summarize(rows)
    print(table)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "judge_model": "scripted (see the module docstring)",
                               "table": table, "rows": rows}, indent=1))


def summarize(rows: list[dict[str, Any]]) -> str:
    def fmt(counter: Counter) -> str:
        return ", ".join(f"{k} {v}" for k, v in counter.most_common())

    lines = [("| trajectory | n | code path | judge path (scripted) | same outcome | "
              "intended class: code / judge |"), "|---|---|---|---|---|---|"]
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        same = sum(r["code"] == r["judge"] for r in mine)
        code_ok = sum(r["code"] == INTENDED[kind] for r in mine)
        judge_ok = sum(r["judge"] == INTENDED[kind] for r in mine)
        lines.append(f"| {kind} | {len(mine)} | {fmt(Counter(r['code'] for r in mine))} | "
                     f"{fmt(Counter(r['judge'] for r in mine))} | {same}/{len(mine)} | "
                     f"{code_ok}/{len(mine)} / {judge_ok}/{len(mine)} |")
    same = sum(r["code"] == r["judge"] for r in rows)
    lines.append(f"| all | {len(rows)} | | | {same}/{len(rows)} | |")
    return "\n".join(lines)


if __name__ == "__main__":
    asyncio.run(main())
