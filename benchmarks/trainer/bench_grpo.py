"""GRPO step on CPU with the tiny model: samples/s and peak memory, at two prompt lengths.

The samples are real: scripted episodes against a ``--no-ray`` farm, split one sample per
assistant turn (``trainer.window.samples``) and tokenized with the tiny model's tokenizer.
The two prompt-length settings are the history window the design uses (w = 3) and the whole
history (no window), so the table also says what the window saves. Each setting runs in its own
process, so its peak RSS is its own.

    .venv/bin/python benchmarks/trainer/bench_grpo.py            # no Ray, no network beyond loopback
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SETTINGS = {"window3": 3, "full_history": None}
ENVS_TASKS = [("hotel_booking_1", 1), ("personal_banking_1", 0)]  # two groups, long solutions
GROUP = int(os.environ.get("BENCH_GRPO_GROUP", "4"))  # rollouts per task (x 2 tasks)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def episodes(tool_listing: str) -> list:
    from envfarm.client import Farm
    from envfarm.compose import LocalFarm
    from envfarm.farm import FarmConfig, PoolConfig
    from trainer.episode import EpisodeConfig, run_episode
    from trainer.policy import ScriptedPolicy

    envs = sorted({e for e, _ in ENVS_TASKS})
    with LocalFarm(FarmConfig(envs=envs, pool=PoolConfig(warm=GROUP))) as local:
        from envfarm import load_catalog

        policy = ScriptedPolicy.from_catalog(load_catalog())
        async with Farm(local.url) as farm:
            # keep every message; windows are cut below
            cfg = EpisodeConfig(window=None, tool_listing=tool_listing)
            return [await run_episode(farm, policy, env, idx, config=cfg)
                    for env, idx in ENVS_TASKS for _ in range(GROUP)]


def child(setting: str, steps: int, micro_batch: int, tool_listing: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.format import render
    from trainer.grpo import GRPOConfig, Sample, grpo_step
    from trainer.tiny_model import tiny_model_path
    from trainer.window import samples as split

    torch.set_num_threads(2)
    path = tiny_model_path()
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path))
    ref = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t0 = time.perf_counter()
    eps = asyncio.run(episodes(tool_listing))
    print(f"episodes: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    batch = []
    for i, ep in enumerate(eps):
        adv = 1.0 if i % 2 else -1.0  # half the group better than the other: signal everywhere
        for s in split(ep.trajectory.messages, SETTINGS[setting]):
            batch.append(Sample(
                prompt_ids=tok.encode(render(s.prompt), add_special_tokens=False),
                completion_ids=tok.encode(s.completion.content or "", add_special_tokens=False)
                + [tok.eos_token_id], advantage=adv))
    cfg = GRPOConfig(micro_batch=micro_batch)
    before = rss_mib()
    t0 = time.perf_counter()
    grpo_step(model, ref, opt, batch[:micro_batch], tok.pad_token_id, cfg)  # warm-up
    print(f"warm-up step of {micro_batch}: {time.perf_counter() - t0:.1f} s", file=sys.stderr,
          flush=True)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        stats = grpo_step(model, ref, opt, batch, tok.pad_token_id, cfg)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    prompt_lens = [len(s.prompt_ids) for s in batch]
    return {"setting": setting, "window": SETTINGS[setting], "tool_listing": tool_listing,
            "samples": len(batch),
            "episodes": len(eps), "prompt_tokens_mean": round(statistics.mean(prompt_lens)),
            "prompt_tokens_max": max(prompt_lens),
            "completion_tokens": sum(len(s.completion_ids) for s in batch),
            "step_s_median": round(med, 3), "step_s_runs": [round(t, 3) for t in times],
            "samples_per_s": round(len(batch) / med, 1),
            "tokens_per_s": round(sum(len(s.prompt_ids) + len(s.completion_ids)
                                      for s in batch) / med),
            "rss_before_step_mib": round(before, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "micro_batch": micro_batch, "loss": round(stats["loss"], 4),
            "params": sum(p.numel() for p in model.parameters())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--child", choices=sorted(SETTINGS))
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated, in order")
    # compact = what trainer/configs/tiny_cpu.yaml trains with; full puts every tool's JSON
    # schema (11-14k tiny-tokenizer tokens) in every sample's prompt
    ap.add_argument("--tool-listing", choices=["compact", "full"], default="compact")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "grpo.json")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.micro_batch, args.tool_listing)))
        return
    res = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "loadavg_start": os.getloadavg(),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
           "settings": {}}
    for name in args.settings.split(","):
        out = subprocess.run([sys.executable, __file__, "--child", name, "--steps",
                              str(args.steps), "--micro-batch", str(args.micro_batch),
                              "--tool-listing", args.tool_listing],
                             capture_output=True, text=True, check=True, cwd=REPO)
        res["settings"][name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(name, res["settings"][name], flush=True)
        res["machine"]["loadavg_end"] = os.getloadavg()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))  # after each setting: a long one may be cut


if __name__ == "__main__":
    main()
