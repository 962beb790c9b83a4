"""The trainer's task sampler skips the farm's quarantined tasks (read over HTTP each step)."""

from __future__ import annotations

from envfarm import EnvRuntime
from envfarm.client import ASGITransport, Farm
from envfarm.compose import compose_core
from envfarm.farm import FarmConfig, PoolConfig, build_app
from tests.envfarm.farm.conftest import lifespan_running
from trainer.train import pick_tasks, quarantined

TASKS = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


def test_quarantined_tasks_and_env_types_are_never_picked() -> None:
    assert pick_tasks(TASKS, 8, seed=3) == pick_tasks(TASKS, 8, seed=3)  # deterministic per step
    picked = pick_tasks(TASKS, 200, seed=3, skip={("a", 1), ("b", None)})
    assert set(picked) == {("a", 0)}
    assert pick_tasks(TASKS, 4, seed=3, skip={("a", None), ("b", None)}) == []


async def test_the_sampler_reads_the_farm_quarantine(bundled_catalog) -> None:
    env = "personal_banking_1"
    bundle = bundled_catalog[env].model_copy(update={"flagged": {3: "code path: dump"}})
    catalog = type(bundled_catalog)({env: bundle}, [], bundled_catalog.root)
    core = compose_core(FarmConfig(envs=[env], pool=PoolConfig(warm=1)), catalog=catalog,
                        runtimes={env: EnvRuntime(bundle)})
    app = build_app(core)
    async with lifespan_running(app), Farm("http://farm", transport=ASGITransport(app)) as farm:
        skip = await quarantined(farm)
        assert skip == {(env, 3)}
        tasks = [(env, i) for i in range(10)]
        assert (env, 3) not in pick_tasks(tasks, 500, seed=0, skip=skip)
        await farm.lift_quarantine(env, 3)
        assert await quarantined(farm) == set()
