"""Where a verification's child spends its CPU and page faults, phase by phase, this tree
against an earlier commit, rounds alternating:

    .venv/bin/python benchmarks/judge/bench_verifier_phases.py --baseline 7267809

Each tree's ``judge`` and ``envfarm`` are copied into a temporary folder and its child
(``_verify_once`` in ``judge/_sandbox_harness.py``) gets ``getrusage`` marks: after the fork
returns, after its jail, after reading its request, after its Landlock layer and audit hook,
after the verifier; the marks ride back in the reply (the copy's front prints and drops them).
One verification at a time (the same real AWM e_commerce_33 code verifiers and databases as
``bench_verifier_procs.py``). The marks cost a little themselves (a few faults each); compare
trees, not absolute figures. What the child spends after its last mark (writing the reply and
its exit) is the children's CPU less the marked sum. Prints one JSON object; ``--out`` writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.judge.bench_verifier_procs import _export, emit, side_by_side  # noqa: E402

PHASES = ("forked", "jail", "request", "landlock", "verifier")

# Where each mark goes in _verify_once: after the line that starts with the key (before it
# where the value says so). Both the first pass's child and this one's have these lines.
_AFTER = {"gc.disable()": "jail", "os.close(req_fd)": "request"}
_BEFORE = {"sys.addaudithook(_HOOK)": "landlock", "_send(rep_fd, reply)": "verifier"}
_MARK = '''import resource as _res
_MARKS = []


def _mark(name):
    r = _res.getrusage(_res.RUSAGE_SELF)
    _MARKS.append(f"{name}:{r.ru_utime + r.ru_stime:.6f}:{r.ru_minflt}")


'''


def _instrument(tree: Path) -> None:
    worker = next(p for p in (tree / "judge" / "_sandbox_harness.py",  # since the split
                              tree / "judge" / "_sandbox_worker.py")
                  if p.exists() and "def _verify_once(" in p.read_text())
    out, inside = [], False
    for line in worker.read_text().split("\n"):
        stripped = line.strip()
        if line.startswith("def _verify_once("):
            inside = True
            out.append(_MARK + line)
            continue
        if inside and line.startswith("def "):
            inside = False
        if inside and stripped in _BEFORE:
            if _BEFORE[stripped] == "verifier":
                out.append('    _mark("verifier")')
                out.append('    reply["marks"] = " ".join(_MARKS)')
            else:
                out.append(f'    _mark("{_BEFORE[stripped]}")')
        out.append(line)
        if inside and stripped.startswith('"""The forked child'):
            out.append('    _mark("forked")')
        for key, name in _AFTER.items():
            if inside and stripped.startswith(key):
                out.append(f'    _mark("{name}")')
    worker.write_text("\n".join(out))
    front = tree / "judge" / "sandbox.py"
    text = front.read_text()
    anchor = '    if (isinstance(reply, dict) and isinstance(reply.get("ok"), bool)'
    assert anchor in text, "judge/sandbox.py: _check_reply changed; update this benchmark"
    front.write_text(text.replace(anchor, '''    if isinstance(reply, dict) and "marks" in reply:
        print("MARKS", reply.pop("marks"), file=sys.stderr)
''' + anchor).replace("import asyncio\n", "import asyncio\nimport sys\n", 1))


def _copy(rev: str | None) -> Path:
    if rev is None:
        folder = Path(tempfile.mkdtemp(prefix="envfarm-phases-"))
        for name in ("judge", "envfarm"):
            shutil.copytree(ROOT / name, folder / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
    else:
        folder = Path(_export(rev))  # the commit's judge/ and envfarm/, as bench_verifier_procs takes them
    _instrument(folder)
    return folder


def _inner(args: argparse.Namespace) -> None:
    """One tree, in this process: run args.n verifications one at a time."""
    sys.path.insert(0, args.root)
    from judge import VerifierSandbox

    import benchmarks.judge.bench_judge as bj

    assert Path(sys.modules["judge"].__file__).is_relative_to(args.root)

    initial = bj._db()
    final = bj._db(["INSERT INTO cart_items (cart_id, product_offer_id, quantity) "
                    "VALUES (1, 8, 1)"])
    codes = [v["code"] for v in bj._verifiers("gen_verifier.pure_code.jsonl")]
    with VerifierSandbox(workers=1) as sandbox:
        for code in codes * 3:
            sandbox.run_sync(code, initial, final)
        zygote = sandbox.pids[0]
        before = _kids(zygote)
        for i in range(args.n):
            assert sandbox.run_sync(codes[i % 3], initial, final).ok
        after = _kids(zygote)
    print(json.dumps({"children_ms": (after - before) / args.n * 1e3}))


def _kids(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def _round(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--inner", "--root", str(tree),
                          "--n", str(args.n)], capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": str(tree)})
    if out.returncode != 0:
        sys.exit(f"{tree} failed:\n{out.stderr[-3000:]}")
    per: dict[str, list[tuple[float, float]]] = {p: [] for p in PHASES}
    for line in out.stderr.splitlines():
        if not line.startswith("MARKS "):
            continue
        t0, f0 = 0.0, 0
        for item in line.split()[1:]:
            name, t, f = item.split(":")
            per[name].append(((float(t) - t0) * 1e3, int(f) - f0))
            t0, f0 = float(t), int(f)
    row = {f"{p}_ms": statistics.mean(t for t, _ in v) for p, v in per.items()}
    row.update({f"{p}_faults": statistics.mean(f for _, f in v) for p, v in per.items()})
    row["children_ms"] = json.loads(out.stdout.splitlines()[-1])["children_ms"]
    row["after_last_mark_ms"] = row["children_ms"] - sum(row[f"{p}_ms"] for p in PHASES)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default="7267809", help="commit to compare with")
    parser.add_argument("--n", type=int, default=400, help="verifications per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        _inner(args)
        return
    trees = {"this_tree": _copy(None), "baseline": _copy(args.baseline)}
    try:
        result = side_by_side(list(trees), args.rounds, lambda name, _: _round(trees[name], args))
    finally:
        for tree in trees.values():
            shutil.rmtree(tree, ignore_errors=True)
    result.update(baseline=args.baseline, n=args.n, rounds=args.rounds)
    emit(result, args.out)

if __name__ == "__main__":
    main()
