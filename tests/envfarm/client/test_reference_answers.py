"""A read-only task's verifier checks the final answer: the SDK's reference episode, the demo's
task pick and the scripted policy all carry the task's stored reference answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cluster.cli_farm import _pick_task
from cluster.compose import compose_core
from envfarm.catalog import BUNDLED_CATALOG, load_catalog
from envfarm.client import ASGITransport, Farm, reference_episode
from envfarm.farm import FarmConfig, PoolConfig, build_app
from tests.envfarm.farm.conftest import lifespan_running
from trainer.policy import ScriptedPolicy, TurnContext

ENV = "hotel_booking_1"
ANSWER = "Reservation HB-7Q2K9T is at hotel 9."
VERIFIER = '''
def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    ok = final_answer is not None and "HB-7Q2K9T" in final_answer and "hotel 9" in final_answer
    return {"result": "complete" if ok else "others"}
'''


@pytest.fixture
def catalog_dir(tmp_path: Path) -> Path:
    """The bundled hotel env with task 0 made read-only: look a reservation up and say where."""
    folder = tmp_path / "catalog"
    shutil.copytree(Path(BUNDLED_CATALOG) / ENV, folder / ENV)
    with open(folder / ENV / "gen_solutions.jsonl", "a") as f:
        f.write(json.dumps({"scenario": ENV, "task_idx": 0, "final_answer": ANSWER, "solution": [
            {"tool": "get_reservation_by_confirmation_code",
             "arguments": {"confirmation_code": "HB-7Q2K9T"}}]}) + "\n")
    with open(folder / ENV / "gen_verifier.pure_code.jsonl", "a") as f:
        f.write(json.dumps({"scenario": ENV, "task_idx": 0, "task": "Where is HB-7Q2K9T?",
                            "verification": {"code": VERIFIER}}) + "\n")
    return folder


async def test_reference_episode_passes_the_stored_answer(catalog_dir):
    catalog = load_catalog(catalog_dir)
    bundle = catalog[ENV]
    assert bundle.solution_answers[0] == ANSWER
    core = compose_core(FarmConfig(catalog=str(catalog_dir), envs=[ENV], pool=PoolConfig(warm=1)),
                        catalog=catalog)
    app = build_app(core)
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app)) as farm:
        with_answer = await reference_episode(farm, ENV, 0, bundle.solutions[0], ANSWER)
        without = await reference_episode(farm, ENV, 0, bundle.solutions[0])
    assert with_answer.verdict.reward == 1.0 and with_answer.steps[0].ok
    assert without.verdict.valid and without.verdict.reward != 1.0


def test_demo_and_scripted_policy_carry_the_answer(catalog_dir):
    config = FarmConfig(catalog=str(catalog_dir), envs=[ENV])
    assert _pick_task(config, ENV, 0)[3] == ANSWER
    policy = ScriptedPolicy.from_catalog(load_catalog(catalog_dir))
    ctx = TurnContext(env=ENV, task_idx=0, task="", turn=2)
    assert ANSWER in policy.turn_text(ctx)
