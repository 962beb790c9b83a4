"""Judge benchmarks: sandboxed verifier throughput, and 1,024 LLM judgments with 200 ms latency.

    .venv/bin/python benchmarks/judge/bench_judge.py sandbox      # verifications/s vs in-process exec
                                                            # (fresh snapshot bytes per call)
    .venv/bin/python benchmarks/judge/bench_judge.py inprocess    # Judge.judge_many, no Ray
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/judge/bench_judge.py serve'
                                                            # Serve deployment, batched vs not

Data: the real AWM e_commerce_33 verifiers and a database built from the AWM samples (set
ENVFARM_AWM_SAMPLES to a folder of AgentWorldModel-1K samples). Prints one JSON object per measurement and merges them into
benchmarks/results/judge.json (``--quick``: a short smoke run that writes nothing unless
``--json`` is given).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks._awm import require_awm_samples
from judge import (
    Judge,
    JudgeConfig,
    JudgeRequest,
    VerifierCode,
    VerifierSandbox,
    parse_raw_response,
)

SCENARIO = "e_commerce_33"


def _record(name: str) -> dict[str, Any]:
    for line in (require_awm_samples() / name).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("scenario") == SCENARIO:
            return rec
    raise LookupError(name)


def _db(statements: list[str] = ()) -> bytes:
    conn = sqlite3.connect(":memory:")
    for table in _record("gen_db.jsonl")["db_schema"]["tables"]:
        conn.execute(table["ddl"])
    for table in _record("gen_sample.jsonl")["sample_data"]["tables"]:
        for stmt in table["insert_statements"]:
            conn.execute(stmt)
    for stmt in statements:
        conn.execute(stmt)
    conn.commit()
    return conn.serialize()


def _verifiers(name: str) -> list[dict[str, Any]]:
    return [json.loads(x)["verification"] for x in (require_awm_samples() / name).read_text().splitlines()]


RECORDS: list[dict[str, Any]] = []


def emit(**fields: Any) -> None:
    fields["load_avg_1m"] = round(os.getloadavg()[0], 2)
    RECORDS.append(fields)
    print(json.dumps(fields), flush=True)


def _fresh(final: bytes, k: int, start: int) -> list[bytes]:
    """k distinct snapshots of the same state, as k leases produce: same size and rows, a
    different header (user_version) each, so no two share content and nothing is cached."""
    out = []
    for i in range(start, start + k):
        conn = sqlite3.connect(":memory:")
        conn.deserialize(final)
        conn.execute(f"PRAGMA user_version = {i + 1}")
        out.append(conn.serialize())
        conn.close()
    return out


# -- 1. sandbox throughput -----------------------------------------------------------------

async def bench_sandbox(n: int, workers: int, chunk: int = 250) -> None:
    """Throughput with fresh final snapshots per call (what leases produce) and, interleaved
    chunk by chunk, with one snapshot reused (staged once, then a cache hit)."""
    initial = _db()
    final = _db(["INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 8, 1)"])
    codes = [v["code"] for v in _verifiers("gen_verifier.pure_code.jsonl")]
    chunk = min(chunk, n)
    rounds = max(1, n // chunk)
    runs: dict[str, list[dict[str, float]]] = {"fresh": [], "same": []}
    seq = 0
    async with VerifierSandbox(workers=workers) as sandbox:
        warm = await asyncio.gather(*(sandbox.run(c, initial, final) for c in codes * workers))
        assert all(r.ok for r in warm), [r.error for r in warm]
        for r in range(rounds):
            for mode in (("fresh", "same") if r % 2 == 0 else ("same", "fresh")):
                if mode == "fresh":
                    finals, seq = _fresh(final, chunk, seq), seq + chunk  # untimed
                else:
                    finals = [final] * chunk
                t0 = time.perf_counter()
                results = await asyncio.gather(*(sandbox.run(codes[i % 3], initial, finals[i])
                                                 for i in range(chunk)))
                wall = time.perf_counter() - t0
                assert all(x.ok for x in results), [x.error for x in results if not x.ok][:1]
                runs[mode].append({"calls_per_s": chunk / wall, "ms_inside": sum(
                    x.elapsed_s for x in results) / chunk * 1e3})
    for mode, label in (("fresh", "fresh snapshot bytes per call"),
                        ("same", "one snapshot reused (cache hit)")):
        rate = [x["calls_per_s"] for x in runs[mode]]
        emit(bench="sandbox", final_db=label, workers=workers, calls=chunk * rounds,
             chunk=chunk, rounds=rounds, calls_per_s_median=round(statistics.median(rate), 1),
             calls_per_s_rounds=[round(x, 1) for x in rate],
             ms_per_call_inside_median=round(statistics.median(
                 x["ms_inside"] for x in runs[mode]), 3))

    # One worker, one call at a time: the latency of a call, fresh vs reused, alternating.
    m = max(50, n // 10)
    lat: dict[str, list[float]] = {"fresh": [], "same": []}
    finals = _fresh(final, m, seq)
    async with VerifierSandbox(workers=1) as sandbox:
        await sandbox.run(codes[0], initial, final)
        for i in range(m):
            for mode in (("fresh", "same") if i % 2 == 0 else ("same", "fresh")):
                t0 = time.perf_counter()
                res = await sandbox.run(codes[i % 3], initial,
                                        finals[i] if mode == "fresh" else final)
                lat[mode].append(time.perf_counter() - t0)
                assert res.ok, res.error
    emit(bench="sandbox_sequential", workers=1, calls_per_mode=m,
         ms_per_call_fresh_p50=round(statistics.median(lat["fresh"]) * 1e3, 3),
         ms_per_call_same_p50=round(statistics.median(lat["same"]) * 1e3, 3))

    # The baseline AWM uses: exec of the source in this process, once per call, on the DB
    # files the env already wrote (no staging).
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ipath, fpath = f"{folder}/i.db", f"{folder}/f.db"
    Path(ipath).write_bytes(initial)
    Path(fpath).write_bytes(final)
    m = max(100, n // 4)
    t0 = time.perf_counter()
    for i in range(m):
        ns: dict[str, Any] = {}
        exec(codes[i % 3], ns)  # noqa: S102 - the unsafe baseline we are measuring against
        ns["verify_task_completion"](ipath, fpath)
    per_exec = (time.perf_counter() - t0) / m
    compiled = [compile(c, "<verifier>", "exec") for c in codes]
    t0 = time.perf_counter()
    for i in range(m):
        ns = {}
        exec(compiled[i % 3], ns)  # noqa: S102
        ns["verify_task_completion"](ipath, fpath)
    per_compiled = (time.perf_counter() - t0) / m
    for p in (ipath, fpath):
        os.unlink(p)
    os.rmdir(folder)
    emit(bench="in_process_exec", calls=m, ms_per_call_exec_source=round(per_exec * 1e3, 3),
         ms_per_call_precompiled=round(per_compiled * 1e3, 3))


# -- 2/3. LLM judgments ---------------------------------------------------------------------

def _judge_requests(n: int, folder: Path) -> list[dict[str, Any]]:
    sql = _verifiers("gen_verifier.jsonl")[0]
    (folder / "initial.db").write_bytes(_db())
    (folder / "final.db").write_bytes(_db(
        ["INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 1, 1)"]))
    req = JudgeRequest(task="Add the top-rated wireless noise cancelling headphones under $200.",
                       verifier=VerifierCode(code=sql["code"], raw_response=sql["raw_response"]),
                       initial_db=str(folder / "initial.db"), final_db=str(folder / "final.db"))
    base = req.model_dump(mode="json", exclude_none=True)
    return [{**base, "id": str(i)} for i in range(n)]


class _Mock:
    """benchmarks/judge/judge_mock_server.py in a child process."""

    def __init__(self, latency: float) -> None:
        script = Path(__file__).with_name("judge_mock_server.py")
        self.proc = subprocess.Popen([sys.executable, str(script), str(latency)],
                                     stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()  # type: ignore[union-attr]
        if not self.url:
            raise RuntimeError("mock endpoint did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _mock(latency: float) -> _Mock:
    return _Mock(latency)


def _llm(mock_url: str) -> dict[str, Any]:
    return {"base_url": mock_url, "model": "judge-mock", "max_concurrency": 256,
            "max_retries": 2, "timeout_s": 30}


def _llm_client(config: dict[str, Any]) -> Any:
    from envfarm.llm import LLMClient, LLMConfig

    return LLMClient(LLMConfig(**config))


async def bench_inprocess(n: int, latency: float, repeat: int) -> None:
    """Judge.judge_many over n requests, and the LLM stage alone, alternating, repeat times."""
    mock = _mock(latency)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            reqs = [JudgeRequest.model_validate(r) for r in _judge_requests(n, Path(tmp))]
            client = _llm_client(_llm(mock.url))
            full, stage = [], []
            async with Judge(JudgeConfig(use_llm="always"), llm_client=client) as judge:
                await judge.judge_many(reqs[:4])
                first = reqs[0]
                vr = await judge.sandbox.run(first.verifier.code, first.initial_db,
                                             first.final_db)
                criteria = parse_raw_response(first.verifier.raw_response)
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    verdicts = await judge.judge_many(reqs)
                    full.append(time.perf_counter() - t0)
                    assert all(v.reward == 1.0 for v in verdicts), verdicts[0]
                    # The LLM stage alone: one verifier output, n classifications in flight.
                    t0 = time.perf_counter()
                    staged = await asyncio.gather(*(judge.llm.classify(r.task, vr, criteria)
                                                    for r in reqs))
                    stage.append(time.perf_counter() - t0)
                    assert all(v.reward == 1.0 for v in staged), staged[0]
        emit(bench="judge_inprocess", judgments=n, llm_latency_s=latency, runs=repeat,
             wall_s_full_pipeline_median=round(statistics.median(full), 3),
             wall_s_full_pipeline_runs=[round(x, 3) for x in full],
             wall_s_llm_stage_only_median=round(statistics.median(stage), 3),
             wall_s_llm_stage_only_runs=[round(x, 3) for x in stage],
             llm_max_concurrency=256, sequential_would_take_s=round(n * latency, 1))
    finally:
        mock.stop()


def _in_private_netns() -> bool:
    # A namespace made by `unshare --net` has nothing but the loopback interface.
    import socket

    return [name for _, name in socket.if_nameindex()] == ["lo"]


async def bench_serve(n: int, latency: float, repeat: int) -> None:
    if not _in_private_netns():
        sys.exit("refusing to start Ray outside a private network namespace; run:\n"
                 "  unshare --net sh -c 'ip link set lo up && exec "
                 f"{sys.executable} {__file__} serve'")
    warnings.simplefilter("ignore")
    import ray
    from ray import serve

    from judge.service import JudgeServiceConfig, judge_app

    mock = _mock(latency)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            reqs = _judge_requests(n, Path(tmp))
            handles = {}
            for label, batch in (("batched", 64), ("unbatched", 1)):
                config = JudgeServiceConfig(judge=JudgeConfig(use_llm="always"),
                                            llm=_llm(mock.url), max_batch_size=batch,
                                            batch_wait_timeout_s=0.01)
                handles[label] = (batch, serve.run(judge_app(config), name=f"judge_{label}",
                                                   route_prefix=f"/{label}"))
                await asyncio.gather(*(handles[label][1].judge.remote(r) for r in reqs[:8]))
            walls: dict[str, list[float]] = {label: [] for label in handles}
            for i in range(repeat):  # both apps deployed; alternate which one runs first
                for label in (("batched", "unbatched") if i % 2 == 0
                              else ("unbatched", "batched")):
                    handle = handles[label][1]
                    t0 = time.perf_counter()
                    verdicts = await asyncio.gather(*(handle.judge.remote(r) for r in reqs))
                    walls[label].append(time.perf_counter() - t0)
                    assert all(v.reward == 1.0 for v in verdicts)
            for label, (batch, handle) in handles.items():
                stats = await handle.stats.remote()
                emit(bench=f"judge_serve_{label}", judgments=n, llm_latency_s=latency,
                     runs=repeat, wall_s_median=round(statistics.median(walls[label]), 3),
                     wall_s_runs=[round(x, 3) for x in walls[label]], max_batch_size=batch,
                     batches_all_runs=stats["batches"], largest_batch=stats["max_batch"])
    finally:
        serve.shutdown()
        ray.shutdown()
        mock.stop()


def save(path: Path) -> None:
    """Merge this run's records into the raw results file, one entry per bench name."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    for rec in RECORDS:
        key = rec["bench"] + (f" ({rec['final_db']})" if "final_db" in rec else "")
        data[key] = {**rec, "date": time.strftime("%Y-%m-%d %H:%M %Z"),
                     "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}"}
    path.write_text(json.dumps(data, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["sandbox", "inprocess", "serve", "all"])
    parser.add_argument("--calls", type=int, default=2000, help="sandbox calls per mode")
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers")
    parser.add_argument("--judgments", type=int, default=1024)
    parser.add_argument("--latency", type=float, default=0.2, help="mock LLM latency (s)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each judge path")
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--json", type=Path, help="merge raw numbers into this file (default: "
                        "benchmarks/results/judge.json; --quick writes only where told)")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.judgments, args.repeat = 200, 64, 1
    if args.what in ("sandbox", "all"):
        asyncio.run(bench_sandbox(args.calls, args.workers, chunk=min(250, args.calls // 2)))
    if args.what in ("inprocess", "all"):
        asyncio.run(bench_inprocess(args.judgments, args.latency, args.repeat))
    if args.what == "serve":
        asyncio.run(bench_serve(args.judgments, args.latency, args.repeat))
    target = args.json or (None if args.quick else ROOT / "benchmarks" / "results" / "judge.json")
    if target is not None:
        save(target)


if __name__ == "__main__":
    main()
