"""`envfarm synth all` killed with SIGKILL mid-run and restarted finishes with no lost or duplicated records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from synth._jsonl import JsonlStore, read_jsonl
from tests.fakes.mock_openai import MockOpenAI
from tests.fakes.scripted_synth import script_pipeline, write_seeds

REPO = Path(__file__).resolve().parents[2]
KEYS = {
    "gen_scenario.jsonl": lambda r: r["name"],
    "gen_tasks.jsonl": lambda r: r["scenario"],
    "gen_db.jsonl": lambda r: r["scenario"],
    "gen_sample.jsonl": lambda r: r["scenario"],
    "gen_spec.jsonl": lambda r: r["scenario"],
    "gen_envs.jsonl": lambda r: r["scenario"],
    "gen_verifier.jsonl": lambda r: (r["scenario"], r["task_idx"]),
    "gen_verifier.pure_code.jsonl": lambda r: (r["scenario"], r["task_idx"]),
    "gen_solutions.jsonl": lambda r: (r["scenario"], r["task_idx"]),
    "synth_report.jsonl": lambda r: (r["stage"], r["scenario"], r.get("task_idx")),
}


def _cmd(mock: MockOpenAI, out: Path, seeds: Path) -> list[str]:
    return [sys.executable, "-m", "synth.cli", "all", "--out", str(out), "--llm-base-url", mock.url,
            "--llm-model", "mock", "--seed-file", str(seeds), "--target-count", "2", "-k", "3",
            "--embedder", "endpoint", "--no-progress", "--concurrency", "2"]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _run_until(cmd: list[str], out: Path, file: str, min_lines: int, timeout: float = 60) -> bool:
    """Start the CLI, SIGKILL it once ``file`` has ``min_lines`` lines; False if it finished first
    (a loaded machine can deschedule this poller past the window). A run that fails says why."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    err.seek(0)
                    assert proc.returncode == 0, err.read()[-3000:].decode(errors="replace")
                    return False
                if _lines(out / file) >= min_lines:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)
                    return True
                time.sleep(0.005)
            raise AssertionError("the run made no progress")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.mark.slow
def test_kill_9_and_resume(tmp_path: Path) -> None:
    out, seeds = tmp_path / "run", tmp_path / "seeds.jsonl"
    write_seeds(seeds)
    with MockOpenAI(latency_s=0.05) as mock:
        script_pipeline(mock, broken=True)
        cmd = _cmd(mock, out, seeds)
        kills = 0
        for file, n in [("gen_db.jsonl", 1), ("gen_envs.jsonl", 1), ("gen_verifier.jsonl", 2)]:
            kills += _run_until(cmd, out, file, n)
        assert kills >= 2  # the run really was interrupted
        final = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert final.returncode == 0, final.stderr[-3000:]

    for name, key in KEYS.items():
        raw = (out / name).read_text()
        assert raw.endswith("\n")
        records = [json.loads(line) for line in raw.splitlines()]  # no torn line survives
        dupes = [k for k, c in Counter(key(r) for r in records).items() if c > 1]
        assert not dupes, (name, dupes)
    assert {r["name"] for r in read_jsonl(out / "gen_scenario.jsonl")} == {"library_1", "recipes_1"}
    assert len(read_jsonl(out / "gen_envs.jsonl")) == 2
    sols = {(r["scenario"], r["task_idx"]) for r in read_jsonl(out / "gen_solutions.jsonl")}
    assert sols == {("library_1", 0), ("library_1", 1), ("recipes_1", 0), ("recipes_1", 1), ("recipes_1", 2)}
    code_v = {(r["scenario"], r["task_idx"]) for r in read_jsonl(out / "gen_verifier.pure_code.jsonl")}
    assert code_v == sols


def test_store_cuts_a_torn_tail_and_refuses_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "gen_tasks.jsonl"
    path.write_text('{"scenario": "a", "tasks": []}\n{"scenario": "b", "ta')  # killed mid-write
    store = JsonlStore(path, lambda r: r["scenario"])
    assert len(store) == 1
    assert store.append_once({"scenario": "b", "tasks": ["x"]})
    assert not store.append_once({"scenario": "a", "tasks": ["dup"]})
    assert [json.loads(line)["scenario"] for line in path.read_text().splitlines()] == ["a", "b"]
