"""The llm reward path: the farm's verify with a trajectory, the trainer's episode judge over a
real judge service (HTTP) or in process, judged while rollouts go on, and a GRPO step on judge
rewards. The judge model is the local OpenAI-compatible mock (a real HTTP server)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn

from cluster.compose import compose_core, judge_for
from envfarm.client import ASGITransport, Farm
from envfarm.errors import JudgeError
from envfarm.farm import FarmConfig, PoolConfig, build_app, free_port
from envfarm.llm import LLMClient, LLMConfig
from envfarm.verdict import RewardConfig
from judge import Judge, JudgeConfig
from judge.http import create_app
from tests.envfarm.farm.conftest import lifespan_running
from tests.fakes.mock_openai import MockOpenAI
from trainer.episode import EpisodeConfig, run_episode
from trainer.judging import EpisodeJudge, settle
from trainer.policy import ScriptedPolicy

ENV = "hotel_booking_1"


def answer(classification: str) -> str:
    return json.dumps({"reasoning": f"judged {classification}", "classification": classification,
                       "confidence": 0.8, "evidence": {"iterations": 3}})


def blocks(prompt: str) -> tuple[dict, dict]:
    task = prompt.split("<task_json>\n", 1)[1].split("\n</task_json>", 1)[0]
    verification = prompt.split("<verification_json>\n", 1)[1].split("\n</verification_json>")[0]
    return json.loads(task), json.loads(verification)


@pytest.fixture
def mock() -> Iterator[MockOpenAI]:
    with MockOpenAI() as server:
        yield server


def _llm_judge(mock: MockOpenAI) -> Judge:
    client = LLMClient(LLMConfig(base_url=mock.url, model="judge", max_retries=0))
    return Judge(JudgeConfig(use_llm="always"), llm_client=client)


@pytest.fixture
async def llm_farm(bundled_catalog, runtimes, mock) -> AsyncIterator[Farm]:
    reward = RewardConfig(path="llm", llm_base_url=mock.url, llm_model="judge")
    core = compose_core(FarmConfig(pool=PoolConfig(warm=2, max_instances=32)),
                        catalog=bundled_catalog, runtimes=runtimes, reward=reward)
    app = build_app(core)
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app)) as f:
        yield f


async def test_farm_llm_path_reaches_partially_completed(llm_farm, mock, bundled_catalog):
    """The farm's verify on the llm path: the sql-mode verifier's facts and the trajectory
    sent with verify go to the judge model; Partially Completed comes back as 0.1."""
    mock.script(answer("Partially Completed"), stage="judge", repeat=True)
    # the episode's verify (through the SDK) sends its trajectory; so does a raw verify
    result = await run_episode(llm_farm, ScriptedPolicy.from_catalog(bundled_catalog), ENV, 0)
    assert (result.outcome, result.reward) == ("partially_completed", 0.1)
    lease = await llm_farm.acquire(ENV, task_idx=0)
    body = {"task_idx": 0, "final_answer": "done",
            "trajectory": result.trajectory.model_dump(mode="json")}
    verdict = await llm_farm._json("POST", lease.path + "/verify", token=lease.token,
                                   json_body=body)
    blank = await lease.verify(0, "done")  # no trajectory: the judge sees none
    await lease.release()
    assert (verdict["outcome"], verdict["reward"], verdict["valid"]) == (
        "partially_completed", 0.1, True)
    assert verdict["details"]["judge"] == "llm" and blank.outcome == "partially_completed"
    first, second, third = mock.requests_for(stage="judge")
    assert blocks(first.last_user)[0]["trajectory"] == blocks(second.last_user)[0]["trajectory"] != []
    assert blocks(third.last_user)[0]["trajectory"] == []
    task_json, verification_json = blocks(second.last_user)
    assert task_json["user_task"] == bundled_catalog[ENV].tasks[0]
    assert task_json["execution_budget"] == 20 and task_json["actual_execution_steps"] == len(
        result.turns)
    assert verification_json["mode"] == "sql"
    assert verification_json["code"] == bundled_catalog[ENV].verifiers[0].code


@pytest.mark.parametrize("classification, reward, success", [
    ("Partially Completed", 0.1, False), ("Completed", 1.0, True)])
async def test_only_a_completed_episode_is_a_success(llm_farm, mock, bundled_catalog,
                                                     classification, reward, success):
    """A partial completion (0.1) is a reward, not a success: not in the episode, its rollout
    line, the step's success rates, nor an evaluation's success count."""
    from trainer.metrics import episode_metrics
    from trainer.rollout import scores

    class Own:
        """The reference turns, written as the model's own (the step's headline rates)."""

        def __init__(self) -> None:
            self.inner = ScriptedPolicy.from_catalog(bundled_catalog)

        async def generate(self, messages, ctx):
            return dataclasses.replace(await self.inner.generate(messages, ctx), policy="own")

    mock.script(answer(classification), stage="judge", repeat=True)
    results = [await run_episode(llm_farm, Own(), ENV, idx) for idx in (0, 1)]
    assert [(r.reward, r.valid) for r in results] == [(reward, True)] * 2
    assert [r.success for r in results] == [r.summary()["success"] for r in results] == [
        success] * 2
    assert scores(results)["overall"].successes == 2 * success
    step = episode_metrics(results, rollout_s=1.0)
    assert step["model_episodes"] == 2
    assert step["success_rate"] == step["model_success_rate"] == float(success)
    assert step["model_reward_mean"] == pytest.approx(reward)


def test_llm_path_without_an_endpoint_fails_at_start(monkeypatch):
    for var in ("ENVFARM_LLM_BASE_URL", "ENVFARM_JUDGE_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(JudgeError, match="ENVFARM_JUDGE_BASE_URL"):
        judge_for(FarmConfig(), RewardConfig(path="llm"))
    monkeypatch.setenv("ENVFARM_REWARD_PATH", "sometimes")
    with pytest.raises(ValueError, match="reward|path|code"):
        RewardConfig.from_env()


class JudgeService:
    """judge.http's ``POST /judge`` app on uvicorn, on a background thread."""

    def __init__(self, judge: Judge) -> None:
        self.port = free_port("127.0.0.1")
        self.judge = judge
        self.server = uvicorn.Server(uvicorn.Config(create_app(judge), host="127.0.0.1",
                                                    port=self.port, log_level="warning",
                                                    loop="asyncio", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.judge.close()  # its LLM client lived on the server's loop, which is gone


async def _episodes(farm: Farm, catalog, judge: EpisodeJudge, jobs, concurrency: int = 4):
    policy = ScriptedPolicy.from_catalog(catalog)
    cfg = EpisodeConfig(judge=judge)
    gate = asyncio.Semaphore(concurrency)
    ends: list[float] = []

    async def one(env: str, idx: int):
        async with gate:
            result = await run_episode(farm, policy, env, idx, config=cfg)
        ends.append(time.monotonic())
        return result

    results = await asyncio.gather(*(one(env, idx) for env, idx in jobs))
    return results, max(ends)


async def test_trainer_judges_over_a_judge_service(farm, mock, bundled_catalog):
    """Episodes go to a real judge service over HTTP; each verdict lands on its episode."""
    mock.script(answer("Partially Completed"), pattern=r'<task_json>\n\{"user_task":"',
                repeat=True)
    judge = _llm_judge(mock)
    with JudgeService(judge) as url:
        episode_judge = EpisodeJudge(bundled_catalog, url=url)
        jobs = [(env, 0) for env in bundled_catalog.servable]
        results, _ = await _episodes(farm, bundled_catalog, episode_judge, jobs)
        assert all(r.pending is not None and r.outcome == "invalid" for r in results)
        await settle(results)
        await episode_judge.aclose()
    assert [(r.outcome, r.reward, r.valid) for r in results] == [
        ("partially_completed", 0.1, True)] * len(jobs)
    assert results[0].details["verdict"]["judge"] == "llm"
    assert len(mock.requests_for(stage="judge")) == len(jobs)


async def test_judge_service_down_is_invalid_never_zero(farm, bundled_catalog):
    port = free_port("127.0.0.1")  # nothing listens there
    episode_judge = EpisodeJudge(bundled_catalog, url=f"http://127.0.0.1:{port}")
    results, _ = await _episodes(farm, bundled_catalog, episode_judge, [(ENV, 0), (ENV, 1)])
    await settle(results)
    await episode_judge.aclose()
    assert [(r.outcome, r.reward, r.valid) for r in results] == [("invalid", None, False)] * 2
    assert all("judge service" in r.reason for r in results)


@pytest.mark.parametrize("overlap", [True, False])
async def test_rollouts_go_on_while_episodes_are_judged(farm, mock, bundled_catalog, overlap):
    """With overlap, the first episodes are being judged before the last rollout ends; without
    it (the baseline), judging starts only when every rollout is done."""
    mock.latency_s = 0.3
    mock.script(answer("Completed"), repeat=True)
    episode_judge = EpisodeJudge(bundled_catalog, judge=_llm_judge(mock), overlap=overlap)
    jobs = [(env, idx) for env in bundled_catalog.servable for idx in (0, 1, 2)]
    results, last_rollout = await _episodes(farm, bundled_catalog, episode_judge, jobs,
                                            concurrency=2)
    await settle(results, episode_judge)
    await episode_judge.aclose()
    assert all(r.outcome == "completed" for r in results)
    first_judged = min(r.received_at for r in mock.requests_for(stage="judge"))
    if overlap:
        assert first_judged < last_rollout
    else:
        assert first_judged >= last_rollout


@pytest.mark.slow
async def test_a_grpo_step_on_judge_rewards(tmp_path, tiny_model, mock, monkeypatch):
    """``envfarm train`` with ``reward_path: llm``: the guided episode is judged (Partially
    Completed, 0.1), the random model's is a format error (-1.0, never sent to the judge)."""
    from cluster.compose import LocalFarm
    from trainer.config import TrainConfig
    from trainer.train import train

    from .test_train import SMALL

    monkeypatch.setenv("ENVFARM_CACHE", str(tiny_model.parents[1]))
    mock.script(answer("Partially Completed"), repeat=True)
    cfg = TrainConfig(**{**SMALL, "steps": 1, "out_dir": str(tmp_path / "run"),
                         "reward_path": "llm", "judge_base_url": mock.url,
                         "judge_model": "judge"})
    farm_cfg = FarmConfig(envs=SMALL["envs"], pool=PoolConfig(warm=2))
    with LocalFarm(farm_cfg) as farm:
        (record,) = await train(cfg, farm.url, log=lambda _: None)
    assert record["reward_mean"] == pytest.approx((0.1 - 1.0) / 2)
    assert record["judge_wait_s"] >= 0 and record["groups_used"] == 1
    (req,) = mock.requests_for(stage="judge")
    assert blocks(req.last_user)[1]["mode"] == "sql"


async def test_on_a_suite_the_judge_path_agrees_with_the_code_path(tmp_path, mock):
    """EnvFactory tasks start from databases of their own. The judge path judged every episode
    against the first task's start (its starting database was kept per env): with the faithful
    judge every reference episode was an "Agent Error" there while the farm's code verifier
    said "completed". Now each episode is judged against its own task's start: the two paths
    agree, episode by episode, on the reference solutions (all pass) and on an agent that
    stops a step short and answers wrongly (most fail)."""
    from envfarm import EnvRuntime, load_catalog
    from tests.fakes.faithful_judge import verdict_of
    from trainer.suite import SuiteConfig, build_suite

    suite = await asyncio.to_thread(  # it runs its own event loop
        build_suite, SuiteConfig(envs=["personal_banking_1"], chains=6, draws=2,
                                 heldout_chains=0.3, heldout_values=0.5,
                                 dir=str(tmp_path / "suite")), log=lambda _: None)
    catalog = load_catalog(suite.catalog)
    env = "personal_banking_1"
    jobs = [idx for _, idx in suite.jobs("train") + suite.jobs("heldout")]
    reference = ScriptedPolicy.from_catalog(catalog)
    short = ScriptedPolicy({(env, i): c[:-1] if len(c) > 1 else c
                            for (e, i), c in reference.solutions.items() if e == env},
                           {(env, i): "I could not find it." for i in jobs})
    core = compose_core(FarmConfig(envs=[env], pool=PoolConfig(warm=2, max_instances=16)),
                        catalog=catalog, runtimes={env: EnvRuntime(catalog[env])})
    mock.script(verdict_of, stage="judge", repeat=True)
    episode_judge = EpisodeJudge(catalog, judge=_llm_judge(mock))
    judged = EpisodeConfig(tool_listing="names", judge=episode_judge)
    by_code = EpisodeConfig(tool_listing="names")
    app = build_app(core)
    starts = set()
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app)) as farm:
        for idx in jobs:
            async with farm.lease(env, task_idx=idx) as lease:
                starts.add(await lease.snapshot("initial"))
        runs = {(policy.name if policy is reference else "short", how): [
                    await run_episode(farm, policy, env, idx, config=config) for idx in jobs]
                for policy in (reference, short) for how, config in (("code", by_code),
                                                                      ("judge", judged))}
        await settle([r for results in runs.values() for r in results])
    await episode_judge.aclose()
    assert len(starts) > 1  # the point: tasks that do not share a start
    outcomes = {key: [r.outcome for r in results] for key, results in runs.items()}
    assert outcomes[("scripted", "code")] == ["completed"] * len(jobs), outcomes
    assert outcomes[("scripted", "judge")] == outcomes[("scripted", "code")]
    assert outcomes[("short", "judge")] == outcomes[("short", "code")], outcomes
    assert outcomes[("short", "code")].count("agent_error") > len(jobs) // 2, outcomes
