"""Verifications/s: a fresh jailed process per verification (this tree) against the reused
worker processes of an earlier commit, side by side, rounds alternating.

    .venv/bin/python benchmarks/judge/bench_verifier_procs.py --baseline 78f61d2

The baseline's ``judge`` and ``envfarm`` packages are exported with ``git archive`` into a
temporary folder; each round runs one implementation in its own subprocess (PYTHONPATH set to
that tree) on the same real AWM e_commerce_33 code verifiers and databases (``--samples``, by
default the AWM samples bench_judge.py reads). Two final-database modes: one snapshot reused
(staged once: the process cost alone) and fresh snapshot bytes per call (what leases send).
Prints one JSON object; ``--out`` writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds of this process and of ``pids`` with the children they reaped (the
    zygote reaps every verification's child; reused workers are ``pids`` themselves)."""
    tck = os.sysconf("SC_CLK_TCK")
    total = sum(os.times()[:2])
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15]) / tck
    return total


def _inner(args: argparse.Namespace) -> None:
    """One implementation, in this process: print calls/s per mode."""
    sys.path.insert(0, args.root)
    from judge import (
        VerifierSandbox,  # first: bench_judge below reuses this tree's judge
    )

    sys.path.insert(1, str(ROOT))
    import benchmarks.judge.bench_judge as bj

    assert Path(sys.modules["judge"].__file__).is_relative_to(args.root)
    if args.samples:
        bj.SAMPLES = Path(args.samples)
    initial = bj._db()
    final = bj._db(["INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 8, 1)"])
    codes = [v["code"] for v in bj._verifiers("gen_verifier.pure_code.jsonl")]
    fresh = bj._fresh(final, args.n, args.seed)

    async def main() -> dict[str, float]:
        out = {}
        async with VerifierSandbox(workers=args.workers) as sandbox:
            warm = await asyncio.gather(*(sandbox.run(c, initial, final) for c in codes * 3))
            assert all(r.ok for r in warm), [r.error for r in warm if not r.ok][:1]
            for mode in ("same", "fresh"):
                finals = fresh if mode == "fresh" else [final] * args.n
                cpu0, t0 = _cpu_s(sandbox.pids), time.perf_counter()
                res = await asyncio.gather(*(sandbox.run(codes[i % 3], initial, finals[i])
                                             for i in range(args.n)))
                out[mode] = args.n / (time.perf_counter() - t0)
                out[f"{mode}_cpu_ms"] = (_cpu_s(sandbox.pids) - cpu0) / args.n * 1e3
                assert all(r.ok for r in res), [r.error for r in res if not r.ok][:1]
        return out

    print(json.dumps(asyncio.run(main())))


def _export(rev: str) -> str:
    folder = tempfile.mkdtemp(prefix="envfarm-baseline-")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "judge", "envfarm"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default="78f61d2", help="commit with reused workers")
    parser.add_argument("--n", type=int, default=600, help="verifications per mode and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", default=None, help="AWM samples folder")
    parser.add_argument("--out", default=None)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        _inner(args)
        return
    roots = {"fresh_process": str(ROOT), "reused_workers": _export(args.baseline)}
    modes = ("same", "fresh", "same_cpu_ms", "fresh_cpu_ms")
    runs: dict[str, dict[str, list[float]]] = {k: {m: [] for m in modes} for k in roots}
    for r in range(args.rounds):
        for impl in (list(roots) if r % 2 == 0 else list(roots)[::-1]):
            cmd = [sys.executable, __file__, "--inner", "--root", roots[impl], "--n", str(args.n),
                   "--workers", str(args.workers), "--seed", str(r * args.n)]
            if args.samples:
                cmd += ["--samples", args.samples]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                 env={**os.environ, "PYTHONPATH": roots[impl]})
            if out.returncode != 0:
                sys.exit(f"{impl} failed:\n{out.stderr[-3000:]}")
            for mode, rate in json.loads(out.stdout.splitlines()[-1]).items():
                runs[impl][mode].append(rate)
    med = statistics.median
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        "baseline": args.baseline, "workers": args.workers, "n": args.n, "rounds": args.rounds,
        **{f"{impl}_{mode}{'' if 'cpu' in mode else '_per_s'}_median": round(med(v), 2)
           for impl, by_mode in runs.items() for mode, v in by_mode.items()},
        **{f"{impl}_{mode}{'' if 'cpu' in mode else '_per_s'}_rounds": [round(x, 2) for x in v]
           for impl, by_mode in runs.items() for mode, v in by_mode.items()},
    }
    for mode in ("same", "fresh"):
        new, old = runs["fresh_process"], runs["reused_workers"]
        result[f"ratio_{mode}_per_s"] = round(med(new[mode]) / med(old[mode]), 3)
        result[f"ratio_{mode}_cpu_ms"] = round(med(new[f"{mode}_cpu_ms"])
                                               / med(old[f"{mode}_cpu_ms"]), 3)
        # What the two cores could do if nothing else ran: cores / CPU per verification.
        for impl, by_mode in runs.items():
            result[f"{impl}_{mode}_capacity_per_s_on_2_cores"] = round(
                2000 / med(by_mode[f"{mode}_cpu_ms"]), 1)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
