"""What a fresh-process verification costs, this tree against an earlier commit, side by side:
verifications/s and CPU per verification by process (the caller, the zygote, the children it
forked and reaped) with page faults, rounds alternating between the two.

    .venv/bin/python benchmarks/judge/bench_verifier_procs.py --baseline dc3ea02

The baseline's ``judge`` and ``envfarm`` packages are exported with ``git archive`` into a
temporary folder; each round runs one implementation in its own subprocess (PYTHONPATH set to
that tree) on the same real AWM e_commerce_33 code verifiers and databases (``--samples``, by
default the AWM samples bench_judge.py reads). Two final-database modes: one snapshot reused
(the process cost alone) and fresh snapshot bytes per call (what leases send). CPU is process
CPU time (``/proc``), not wall time, so it holds on a loaded machine better than rates do;
faults are counted too (a copy-on-write fault is most of what a forked child costs here).
Prints one JSON object; ``--out`` writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("front_ms", "zygote_ms", "children_ms", "cpu_ms", "zygote_faults", "child_faults")


def _stat(pid: int) -> dict[str, float]:
    """CPU seconds and minor faults of ``pid`` itself and of the children it reaped."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return {"self": (int(fields[11]) + int(fields[12])) / tck,
            "kids": (int(fields[13]) + int(fields[14])) / tck,
            "faults": int(fields[7]), "kid_faults": int(fields[8])}


def _costs(before: dict, after: dict, front_s: float, n: int) -> dict[str, float]:
    zygote = (after["self"] - before["self"]) / n * 1e3
    kids = (after["kids"] - before["kids"]) / n * 1e3
    front = front_s / n * 1e3
    return {"front_ms": front, "zygote_ms": zygote, "children_ms": kids,
            "cpu_ms": front + zygote + kids,
            "zygote_faults": (after["faults"] - before["faults"]) / n,
            "child_faults": (after["kid_faults"] - before["kid_faults"]) / n}


def _inner(args: argparse.Namespace) -> None:
    """One implementation, in this process: print rate and costs per mode."""
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
            (zygote,) = sandbox.pids
            for mode in ("same", "fresh"):
                finals = fresh if mode == "fresh" else [final] * args.n
                before, front0, t0 = _stat(zygote), sum(os.times()[:2]), time.perf_counter()
                res = await asyncio.gather(*(sandbox.run(codes[i % 3], initial, finals[i])
                                             for i in range(args.n)))
                wall = time.perf_counter() - t0
                costs = _costs(before, _stat(zygote), sum(os.times()[:2]) - front0, args.n)
                out[f"{mode}_per_s"] = args.n / wall
                out.update({f"{mode}_{k}": v for k, v in costs.items()})
                assert all(r.ok for r in res), [r.error for r in res if not r.ok][:1]
        return out

    print(json.dumps(asyncio.run(main())))


def _export(rev: str) -> str:
    folder = tempfile.mkdtemp(prefix="envfarm-baseline-")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "judge", "envfarm"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return folder


def _round(impl: str, root: str, args: argparse.Namespace, seed: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--inner", "--root", root, "--n", str(args.n),
           "--workers", str(args.workers), "--seed", str(seed)]
    if args.samples:
        cmd += ["--samples", args.samples]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": root})
    if out.returncode != 0:
        sys.exit(f"{impl} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default="dc3ea02",
                        help="commit to compare with (dc3ea02: before issue 35's cuts)")
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
    roots = {"this_tree": str(ROOT), "baseline": _export(args.baseline)}
    try:
        result = side_by_side(list(roots), args.rounds, lambda impl, r: _round(
            impl, roots[impl], args, r * args.n))
    finally:
        shutil.rmtree(roots["baseline"], ignore_errors=True)
    result.update(baseline=args.baseline, workers=args.workers, n=args.n, rounds=args.rounds)
    new, old = result["median"]["this_tree"], result["median"]["baseline"]
    for mode in ("same", "fresh"):
        result[f"ratio_{mode}_cpu_ms"] = round(new[f"{mode}_cpu_ms"] / old[f"{mode}_cpu_ms"], 3)
        result[f"ratio_{mode}_per_s"] = round(new[f"{mode}_per_s"] / old[f"{mode}_per_s"], 3)
        # What two cores could do if nothing else ran: 2 cores / CPU per verification.
        for impl, med in result["median"].items():
            result[f"{impl}_{mode}_capacity_per_s_on_2_cores"] = round(
                2000 / med[f"{mode}_cpu_ms"], 1)
    emit(result, args.out)


def side_by_side(names: list[str], rounds: int,
                 run: Callable[[str, int], dict[str, float]]) -> dict:
    """``run(name, round)`` for each name, rounds taking turns (the order flips each round),
    the load noted before each run; medians and every round's figures."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    loads = []
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            loads.append(round(os.getloadavg()[0], 2))
            runs[name].append(run(name, r))
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
        "load_avg_1m_at_each_run": loads,
        "median": {name: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
                   for name, rs in runs.items()},
        "rounds_raw": {name: [{k: round(v, 3) for k, v in r.items()} for r in rs]
                       for name, rs in runs.items()},
    }


def emit(result: dict, out: str | None) -> None:
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


if __name__ == "__main__":
    main()
