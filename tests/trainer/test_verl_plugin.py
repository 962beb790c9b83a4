"""The verl plugin on CPU: construction the way verl's worker builds it, and real episodes
against a real ``--no-ray`` farm on loopback (the tiny model through verl's generate interface,
and the scripted policy). Skipped where verl (the ``gpu`` extra) is not installed."""

from __future__ import annotations

import asyncio

import pytest

verl = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop",
    reason="verl is not installed: verl 0.9.1 needs transformers<5.11, the train extra pins 5.23.0; "
           "see docs/training.md (pip install verl==0.9.1 cachetools in a separate venv)")

import hydra  # noqa: E402  (verl's own dependency)
from omegaconf import OmegaConf  # noqa: E402

from envfarm.client import Farm  # noqa: E402
from envfarm.compose import LocalFarm  # noqa: E402
from envfarm.farm import FarmConfig, PoolConfig  # noqa: E402
from trainer.format import render  # noqa: E402
from trainer.window import samples  # noqa: E402

ENV = "hotel_booking_1"


@pytest.fixture(scope="module")
def local_farm():
    with LocalFarm(FarmConfig(envs=[ENV], pool=PoolConfig(warm=2, max_instances=32))) as farm:
        yield farm


@pytest.fixture
async def client(local_farm):
    async with Farm(local_farm.url) as farm:
        yield farm


def leased(farm: LocalFarm) -> int:
    return sum(stats.leased for stats in farm.core.pool_stats())


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def verl_config(n: int = 2, use_v1: bool = True, prompt_length: int = 8192):
    return OmegaConf.create({
        "trainer": {"use_v1": use_v1},
        "actor_rollout_ref": {"rollout": {"prompt_length": prompt_length,
                                          "response_length": 48, "n": n,
                                          "val_kwargs": {"n": 1}}},
        "data": {"apply_chat_template_kwargs": {}},
    })


def make_loop(farm_url: str, tokenizer, server=None, *, use_v1: bool = True, n: int = 2,
              farm: Farm | None = None, prompt_length: int = 8192, **loop_kwargs):
    """Build the loop as verl's AgentLoopWorker does: registry entry from our packaged YAML,
    then ``hydra.utils.instantiate`` with the worker's arguments."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from trainer.verl_plugin import AGENT_NAME, packaged_config

    for entry in OmegaConf.load(packaged_config()):
        _agent_loop_registry[entry.name] = entry  # what agent_loop_config_path does
    cfg = verl_config(n=n, use_v1=use_v1, prompt_length=prompt_length)
    entry = OmegaConf.merge(_agent_loop_registry[AGENT_NAME],
                            {"farm_url": farm_url, **loop_kwargs})
    loop = hydra.utils.instantiate(
        config=entry, trainer_config=DictConfigWrap(cfg), server_manager=server,
        tokenizer=tokenizer, processor=None, hf_model_type="qwen3", dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data))
    loop.farm = farm  # the test's client (closed by its fixture); verl's workers share one
    return loop


def row(task_idx: int, uid: str = "u0", session: int = 0, split: str = "train") -> dict:
    return {"extra_info": {"env": ENV, "task_idx": task_idx, "split": split}, "uid": uid,
            "session_id": session, "global_steps": 1, "raw_prompt": []}


def test_registered_and_shipped():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from trainer.verl_plugin import AGENT_NAME, EXAMPLE_CONFIG, packaged_config

    assert _agent_loop_registry[AGENT_NAME] == {"_target_": "trainer.verl_plugin.EnvfarmAgentLoop"}
    example = OmegaConf.load(packaged_config(EXAMPLE_CONFIG))
    assert example.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_NAME
    assert example.actor_rollout_ref.actor.clip_ratio_high == 0.28
    assert example.trainer.use_v1 is True


def test_example_config_composes_with_verls_defaults():
    """The example is a valid override of verl 0.9.1's own ppo_trainer config."""
    from hydra import compose, initialize_config_dir

    from trainer.verl_plugin import EXAMPLE_CONFIG, packaged_config

    path = packaged_config(EXAMPLE_CONFIG)
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        cfg = compose(config_name=path.stem)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.rollout.n == 16
    assert cfg.actor_rollout_ref.actor.kl_loss_coef == 0.001
    assert cfg.algorithm.rollout_correction.rollout_is == "sequence"
    assert cfg.data.train_batch_size // cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 4
    assert cfg.actor_rollout_ref.rollout.prompt_length == 6144  # interpolated from data.*


def test_legacy_trainer_is_refused_with_a_clear_error(local_farm, tokenizer):
    from hydra.errors import InstantiationException

    with pytest.raises(InstantiationException, match="use_v1"):
        make_loop(local_farm.url, tokenizer, use_v1=False)


async def test_tiny_model_episode_through_verls_generate(local_farm, client, tokenizer,
                                                         tiny_model):
    """The tiny random model answers through verl's server interface; whatever it writes
    (a format error, from random weights) ends the episode cleanly with its per-turn sample."""
    from trainer.verl_plugin import LocalHFServer

    server = LocalHFServer(tiny_model)
    loop = make_loop(local_farm.url, tokenizer, server, farm=client, max_turn_tokens=24)
    outs = await loop.run({"temperature": 1.0}, **row(0, split="val"))
    ep = loop.episode
    assert ep is not None and ep.valid and len(outs) == len(ep.turns) >= 1
    first = outs[0]
    # the sample is exactly what the model saw and sampled: system + task, rendered
    assert first.prompt_ids == tokenizer.encode(render(ep.turns[0].prompt),
                                                add_special_tokens=False)
    assert first.response_ids == ep.turns[0].generation.completion_ids
    assert 1 <= len(first.response_ids) <= 24
    assert len(first.response_logprobs) == len(first.response_ids)
    assert all(lp <= 0.0 for lp in first.response_logprobs)
    assert first.response_mask == [1] * len(first.response_ids)
    assert first.reward_score == ep.reward
    assert leased(local_farm) == 0


async def test_scripted_episode_gives_one_windowed_sample_per_turn(local_farm, client,
                                                                   tokenizer):
    loop = make_loop(local_farm.url, tokenizer, farm=client, policy="scripted")
    outs = await loop.run({"temperature": 1.0}, **row(1, split="val"))
    ep = loop.episode
    assert ep.success and ep.reward == 1.0
    solution = loop_solution_len(1)
    assert len(outs) == solution + 2  # list_tools, each call, the final answer
    expected = samples(ep.trajectory.messages, 3)
    assert len(expected) == len(outs)
    for out, sample in zip(outs, expected):
        assert out.prompt_ids == tokenizer.encode(render(sample.prompt), add_special_tokens=False)
        assert out.response_ids == (tokenizer.encode(sample.completion.content,
                                                     add_special_tokens=False)
                                    + [tokenizer.eos_token_id])
        assert out.reward_score == 1.0
        assert out.extra_fields["reward_extra_info"]["outcome"] == ep.outcome
    # the window bites: the last sample's prompt no longer holds the first real call
    last = tokenizer.decode(outs[-1].prompt_ids)
    assert last.count("<|im_start|>assistant") == 1 + 3 + 1  # list_tools, w = 3, generation
    assert leased(local_farm) == 0


async def test_prompts_stay_within_rollout_prompt_length(local_farm, client, tokenizer):
    """verl's ``rollout.prompt_length`` is the loop's prompt budget, measured with verl's
    tokenizer: at 2,000 tokens the full listing (~12k) becomes names only and every sample's
    prompt fits; with ``on_long_prompt: fail`` the run stops naming the budget."""
    from trainer.budget import PromptBudgetError

    loop = make_loop(local_farm.url, tokenizer, farm=client, policy="scripted",
                     prompt_length=2000, max_tool_chars=300)
    outs = await loop.run({}, **row(1, split="val"))
    assert loop.episode.success and max(len(o.prompt_ids) for o in outs) <= 2000
    listing = next(m for m in loop.episode.trajectory.messages if m.role == "tool")
    assert '"input_schema"' not in listing.content
    failing = make_loop(local_farm.url, tokenizer, farm=client, policy="scripted",
                        prompt_length=2000, on_long_prompt="fail")
    with pytest.raises(PromptBudgetError, match="prompt budget 2000"):
        await failing.run({}, **row(1, split="val"))
    assert leased(local_farm) == 0


def loop_solution_len(task_idx: int) -> int:
    from envfarm import load_catalog

    return len(load_catalog()[ENV].solutions[task_idx])


async def test_group_gate_trains_only_groups_with_signal(local_farm, client, tokenizer):
    """Two scripted sessions of one group both succeed: zero variance, nothing to learn, so
    neither returns samples; the same runs as val rows (no gate) do."""
    loop = make_loop(local_farm.url, tokenizer, farm=client, policy="scripted", n=2)
    sibling = make_loop(local_farm.url, tokenizer, farm=client, policy="scripted", n=2)
    a, b = await asyncio.gather(loop.run({}, **row(2, uid="g1", session=0)),
                                sibling.run({}, **row(2, uid="g1", session=1)))
    assert a == [] and b == []
    assert loop.episode.success
    assert await loop.run({}, **row(2, uid="g2", split="val"))
    assert leased(local_farm) == 0


def test_group_rule():
    from trainer.verl_plugin import group_keeps

    assert group_keeps([1.0, -1.0])
    assert group_keeps([1.0, None, 0.1])
    assert not group_keeps([1.0, None])       # < 2 valid: invalid ones never count as 0
    assert not group_keeps([0.1, 0.1, 0.1])   # zero variance
    assert not group_keeps([None, None])


async def test_an_invalid_episode_gives_no_samples(tokenizer):
    """A farm that cannot be reached: the rollout is invalid and dropped, not scored 0."""
    from envfarm.farm import free_port

    url = f"http://127.0.0.1:{free_port()}"
    loop = make_loop(url, tokenizer, farm=Farm(url, retries=0), policy="scripted")
    try:
        assert await loop.run({}, **row(0, split="val")) == []
    finally:
        await loop.farm.aclose()
    assert loop.episode is not None and not loop.episode.valid


def test_dataset_rows_address_every_servable_task(tmp_path):
    import pandas as pd

    from trainer.verl_plugin import AGENT_NAME, dataset_rows, task_of, write_dataset

    rows = dataset_rows()
    assert len(rows) == 30 and all(r["agent_name"] == AGENT_NAME for r in rows)
    assert task_of(rows[3]) == (rows[3]["extra_info"]["env"], rows[3]["extra_info"]["task_idx"])
    out = tmp_path / "train.parquet"
    assert write_dataset(out, envs=[ENV], split="val") == 10
    back = pd.read_parquet(out)
    assert back.iloc[4]["extra_info"]["task_idx"] == 4
    assert back.iloc[4]["extra_info"]["split"] == "val"
    with pytest.raises(ValueError, match="extra_info.env"):
        task_of({"extra_info": {}})


async def test_outputs_through_verls_own_v1_advantages_and_tags(local_farm, client, tokenizer,
                                                                tiny_model):
    """verl's own V1 code on the plugin's outputs (where TransferQueue, which V1 imports, is
    installed): the weight-version tags as ``np.array(dtype=int)``, and
    ``compute_advantage_for_multi_trajectories`` over a group of a solved episode (every turn
    the same positive advantage) and a format-error one (only its violating turn, negative)."""
    pytest.importorskip("transfer_queue", reason="verl's V1 trainer imports TransferQueue "
                        "(verl-core extra): pip install TransferQueue")
    import warnings

    import numpy as np
    import torch
    from verl.protocol import DataProto

    with warnings.catch_warnings():  # verl warns about engines it cannot load (megatron ...)
        warnings.simplefilter("ignore")
        from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    from trainer.verl_plugin import LocalHFServer

    good = make_loop(local_farm.url, tokenizer, farm=client, policy="scripted")
    bad = make_loop(local_farm.url, tokenizer, LocalHFServer(tiny_model), farm=client,
                    max_turn_tokens=16)
    sessions = [await good.run({}, **row(1, split="val")),
                await bad.run({"temperature": 1.0}, **row(1, split="val"))]
    assert good.episode.success and bad.episode.outcome == "format_error"
    assert len(sessions[0]) == len(good.episode.turns) and len(sessions[1]) == 1
    keys, dicts = [], []
    for s, outs in enumerate(sessions):
        for i, out in enumerate(outs):
            keys.append(f"uidA_{s}_{i}")
            dicts.append(out.as_dict())
    # _agent_loop_postprocess's tags, then _compute_metrics' arrays: no None may reach them
    lo = np.array([d["extra_fields"]["min_global_steps"] for d in dicts], dtype=int)
    hi = np.array([d["extra_fields"]["max_global_steps"] for d in dicts], dtype=int)
    assert (hi - lo + 1).max() == 1
    width = max(d["responses"].numel() for d in dicts)
    scores = torch.zeros(len(dicts), width)
    mask = torch.zeros(len(dicts), width, dtype=torch.int64)
    for r, d in enumerate(dicts):
        n = d["responses"].numel()
        scores[r, :n] = d["rm_scores"]
        mask[r, :n] = d["response_mask"]
    data = DataProto.from_dict(tensors={"token_level_rewards": scores, "response_mask": mask},
                               non_tensors={"uid": np.array(["uidA"] * len(dicts), dtype=object)})
    out = compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator="grpo",
                                                   num_repeat=2, norm_adv_by_std_in_grpo=True)
    per_row = [float(out.batch["advantages"][r, 0]) for r in range(len(dicts))]
    solved, failed = per_row[:len(sessions[0])], per_row[len(sessions[0]):]
    assert len(set(solved)) == 1 and solved[0] > 0
    assert failed == [pytest.approx(-solved[0])]
