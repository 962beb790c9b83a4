"""Peak memory and time of one GRPO update: today's step against the one before it.

    python benchmarks/trainer/bench_grpo_step.py                       # both, 3 steps each, one line each
    python benchmarks/trainer/bench_grpo_step.py --baseline 78f61d2    # the commit whose step to compare

The samples are the same for every variant: ``--samples`` windowed prompts of ``--prompt``
tokens and completions of ``--completion`` tokens, on a random-init Qwen3 with Qwen3's own
vocabulary size (151,936: what makes full-vocabulary logits expensive) and a small body, on CPU.
Each variant runs in a fresh process; its figure is the process's peak RSS during the steps
above its peak before them (model, reference, samples and a warm-up forward already built;
AdamW's state, the same for all, is allocated by the first step and counted), and the median
time of the steps after the first. Variants: ``baseline`` (``trainer/grpo.py`` at ``--baseline``, read
with ``git show``: logits at every position, full vocabulary, fp32), ``now`` (completion-only,
chunked LM head), ``now+gc`` (also gradient checkpointing in the decoder).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VOCAB = 151_936


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _load_grpo(baseline: str | None):
    if baseline is None:
        from trainer import grpo

        return grpo
    source = subprocess.run(["git", "show", f"{baseline}:trainer/grpo.py"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "grpo_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("grpo_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["grpo_baseline"] = module
    spec.loader.exec_module(module)
    return module


def run_variant(variant: str, args: argparse.Namespace) -> dict:
    import copy

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    grpo = _load_grpo(args.baseline if variant == "baseline" else None)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                         num_hidden_layers=args.layers, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=args.hidden // 4,
                         max_position_embeddings=args.prompt + args.completion + 8)
    model = Qwen3ForCausalLM(config)
    if variant == "now+gc":
        model.gradient_checkpointing_enable()
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(1)
    samples = []
    for i in range(args.samples):
        ids = torch.randint(10, VOCAB, (args.prompt + args.completion,), generator=gen).tolist()
        samples.append(grpo.Sample(ids[:args.prompt], ids[args.prompt:], 1.0 if i % 2 else -1.0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    cfg = grpo.GRPOConfig(micro_batch=args.micro_batch)
    with torch.no_grad():  # warm-up: allocator and kernels, so the delta is the step's own
        model(input_ids=torch.tensor([samples[0].prompt_ids[:64]]))
    grpo_step = grpo.grpo_step
    before = _peak_mib()
    times = []
    for _ in range(args.steps + 1):  # the first step also allocates AdamW's state: untimed
        t = time.perf_counter()
        grpo_step(model, ref, opt, samples, 0, cfg)
        times.append(time.perf_counter() - t)
    return {"variant": variant, "peak_over_setup_mib": round(_peak_mib() - before),
            "peak_rss_mib": round(_peak_mib()),
            "step_s_median": round(statistics.median(times[1:]), 2),
            "step_s": [round(x, 2) for x in times[1:]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="78f61d2", help="commit of the step to compare")
    ap.add_argument("--variants", default="baseline,now,now+gc")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--completion", type=int, default=64)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one variant in this process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_variant(args.one, args)))
        return
    for variant in args.variants.split(","):
        opts = {k: v for k, v in vars(args).items() if k not in ("one", "variants")}
        cmd = [sys.executable, __file__, "--one", variant] + [
            x for k, v in opts.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
        print(line, flush=True)


if __name__ == "__main__":
    main()
