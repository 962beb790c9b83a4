"""Issue 32's measure: tasks probed, passed by a hack (before / after), quarantined at load.

    python benchmarks/synth/bench_integrity.py [--before /path/to/main] [--chains 20] \
        [--awm AWM_1K_FOLDER] [--out benchmarks/results/integrity.json]

Three sources, each through the hack-probe suite (``envfarm.hackprobes``, code path; the LLM-judge
path needs a judge model, which this machine has not):

- the bundled catalog: this checkout's verifiers, and with ``--before`` the catalog of another
  checkout (its verifiers, probed by this suite);
- an EnvFactory run on the bundled envs, offline (scripted QueryGen + scripted agent on the mock
  OpenAI server, ``tests/fakes/factory_agent.py``): ``--chains`` chains per env through
  ``make_episodes``; every accepted episode is probed. With ``--before`` the same chains go through
  the other checkout's pipeline (its verifier template, gate and test agent, in a subprocess on
  its code) and its accepted episodes are probed by this suite;
- an AWM-1K folder (``--awm``: the dataset or the samples of it): every task with a verifier, on
  its database (an env without code: no-op, echo and guesses only).

"Quarantined" counts the tasks a farm would take out of rotation at load: those the probes flag
(``envfarm envs check --hacks --write-flags``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from envfarm.catalog import load_catalog  # noqa: E402
from envfarm.hackprobes import ProbeTask, bundle_tasks, probe_tasks  # noqa: E402
from envfarm.models import ToolCall  # noqa: E402
from envfarm.runtime import EnvRuntime  # noqa: E402
from envfarm.template import build_template  # noqa: E402
from judge import Judge, JudgeConfig, VerifierSandbox  # noqa: E402

ENVS = ["hotel_booking_1", "personal_banking_1", "project_management_1"]

#: Runs EnvFactory's queries stage with whatever checkout is first on sys.path (only API both
#: sides have), and prints the episodes as JSON lines.
_FACTORY_DRIVER = r'''
import asyncio, json, sys
from envfarm import EnvRuntime, load_catalog
from envfarm.llm import LLMClient, LLMConfig
from judge import VerifierSandbox
from synth.factory.chains import sample_chains
from synth.factory.dbvalues import db_columns
from synth.factory.graph import build_graph
from synth.factory.queries import make_episodes
from tests.fakes.mock_openai import MockOpenAI
try:
    from tests.fakes.factory_agent import ScriptedWorld, scripted_solver
except ImportError:  # a checkout from before tests/fakes held it
    from tests.synth.factory_agent import ScriptedWorld, scripted_solver

async def main(envs, n, kw):
    with MockOpenAI() as mock, VerifierSandbox(workers=2, timeout_s=10.0) as sandbox:
        ScriptedWorld().install(mock)
        solver = scripted_solver(mock)
        async with LLMClient(LLMConfig(base_url=mock.url, model="mock", max_retries=0)) as llm:
            for env in envs:
                runtime = EnvRuntime(load_catalog()[env])
                columns = db_columns(runtime.template.data)
                graph = await build_graph(runtime, embedder=None)
                chains = sample_chains(graph, columns, n=n, max_len=3, seed=0)
                for e in await make_episodes(runtime, chains, columns, llm, sandbox, solver, **kw):
                    print(json.dumps(e.model_dump(mode="json")), flush=True)
        await solver.aclose()

asyncio.run(main(sys.argv[1].split(","), int(sys.argv[2]), {"keep": None} if sys.argv[3:] == ["shared"] else {}))
'''


def factory_episodes(checkout: Path, envs: list[str], n: int, shared: bool = False) -> list[dict]:
    """The episodes of ``checkout``'s EnvFactory pipeline on ``envs`` (a subprocess on its code);
    ``shared``: every chain on the env's sample data (no per-scenario state)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(_FACTORY_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, fh.name, ",".join(envs), str(n), *(["shared"] if shared else [])],
                         cwd=checkout, env=env,
                         capture_output=True, text=True, timeout=3600, check=True)
    os.unlink(fh.name)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _row(source: str, reports: list, flagged: int | None = None, **extra) -> dict:
    kinds = Counter(p.value for r in reports for p in r.hacked)
    hacked = sum(bool(r.hacked) for r in reports)
    return {"source": source, "tasks_probed": len(reports), "passed_by_a_hack": hacked,
            "undecided": sum(bool(r.undecided) and not r.hacked for r in reports),
            "by_probe": dict(sorted(kinds.items())),
            "quarantined_at_load": sum(r.rejects for r in reports) if flagged is None else flagged, **extra}


async def probe_catalog(path: Path | None, judge: Judge, envs: list[str]) -> list:
    catalog = load_catalog(path)
    reports = []
    for name in envs:
        reports += await probe_tasks(EnvRuntime(catalog[name]), bundle_tasks(catalog[name]), judge)
    return reports


async def probe_episodes(episodes: list[dict], judge: Judge) -> list:
    reports = []
    catalog = load_catalog()
    by_env: dict[str, list[dict]] = {}
    for e in episodes:
        if e.get("accepted"):
            by_env.setdefault(e["env"], []).append(e)
    for env, eps in sorted(by_env.items()):
        runtime = EnvRuntime(catalog[env])
        tasks = [ProbeTask(text="\n\n".join(e["messages"]), code_verifier=e["verifier_code"],
                           solution=[ToolCall(tool=c["tool"], arguments=c["arguments"]) for c in e["calls"]],
                           final_answer=e.get("final_answer"),
                           initial_db=runtime.task_initial(None) if not e.get("task_state") else _state(runtime, e))
                 for e in eps]
        reports += await probe_tasks(runtime, tasks, judge, env=env)
    return reports


def _state(runtime: EnvRuntime, episode: dict) -> bytes:
    from envfarm.dbrows import without_rows

    return without_rows(runtime.template.data, episode["task_state"])


async def probe_awm(folder: Path, judge: Judge) -> list:
    catalog = load_catalog(folder)
    reports = []
    for name in catalog.names:
        bundle = catalog[name]
        tasks = bundle_tasks(bundle)
        if not tasks:
            continue
        if bundle.servable:
            reports += await probe_tasks(EnvRuntime(bundle), tasks, judge, env=name)
        else:
            initial = build_template(bundle.db_schema, bundle.sample_data).data
            reports += await probe_tasks(None, [t.model_copy(update={"initial_db": initial}) for t in tasks],
                                         judge, env=name)
    return reports


async def main(args: argparse.Namespace) -> list[dict]:
    rows = []
    with VerifierSandbox(workers=2, timeout_s=10.0) as sandbox:
        judge = Judge(JudgeConfig(use_llm="never"), sandbox=sandbox)
        if args.before:
            rows.append(_row("bundled catalog, before", await probe_catalog(
                args.before / "envfarm" / "catalog", judge, ENVS), flagged=0, note="no quarantine before"))
        rows.append(_row("bundled catalog, after", await probe_catalog(None, judge, ENVS)))
        runs = [("EnvFactory run, before", args.before, False)] if args.before else []
        runs += [("EnvFactory run, after", REPO, False),
                 ("EnvFactory run, after, every chain on the shared sample data", REPO, True)]
        for source, checkout, shared in runs:
            eps = factory_episodes(checkout, ENVS, args.chains, shared)
            rows.append(_row(source, await probe_episodes(eps, judge), **({"flagged": 0} if checkout != REPO else {}),
                             chains=len(eps), accepted=sum(bool(e.get("accepted")) for e in eps),
                             drops=dict(sorted(Counter(e["reason"] for e in eps if not e["accepted"]).items()))))
        if args.awm:
            rows.append(_row(f"AWM-1K ({args.awm.name})", await probe_awm(args.awm, judge)))
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, default=None, help="another checkout (e.g. main) to compare with")
    ap.add_argument("--chains", type=int, default=20, help="EnvFactory chains per env")
    ap.add_argument("--awm", type=Path, default=None, help="an AWM-1K folder to probe too")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "integrity.json")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    rows = asyncio.run(main(args))
    for row in rows:
        print(json.dumps(row))
    result = {"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
              "machine": f"{os.cpu_count()} cores, shared; 1-min load {load:.2f} at start, "
                         f"{os.getloadavg()[0]:.2f} at end",
              "path": "code (the LLM-judge path needs a judge model)", "chains_per_env": args.chains,
              "rows": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
