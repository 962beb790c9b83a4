"""verl 0.9.1 plugin: our agent loop as a verl ``AgentLoop`` (``gpu`` extra).

verl's GRPO then trains on exactly what our loop produces: one sample per assistant turn, each
its own windowed prompt (system + task + first ``list_tools`` exchange + last w turns, the same
``trainer.window`` the CPU trainer uses) and that turn's tokens as the response (loss mask 1 on
the turn only). Leases go through the SDK, rewards come from the farm's verify/judge path.

    # verl config (see trainer/verl_example.yaml, shipped with the package)
    trainer.use_v1: true          # the V1 trainer takes several outputs per agent loop
    actor_rollout_ref.rollout.agent.agent_loop_config_path: <trainer/verl_agent_loop.yaml>
    data.train_files: envfarm.parquet    # python -m trainer.verl_plugin dataset envfarm.parquet

How the pieces map onto verl 0.9.1 (``verl.experimental.agent_loop``):
- ``EnvfarmAgentLoop`` is registered with ``@register("envfarm_agent")`` and listed in
  ``verl_agent_loop.yaml`` (what ``agent_loop_config_path`` loads in the Ray workers, where a
  decorator in an unimported module would not have run). Extra YAML keys (``farm_url``,
  ``window``, ...) arrive as constructor keyword arguments through ``hydra.utils.instantiate``.
- ``run`` returns a *list* of ``AgentLoopOutput`` (built by ``trainer.verl_outputs``, which
  says what V1 reads from them): verl's V1 trainer (``AgentLoopWorkerTQ``) stores each under
  ``{uid}_{session}_{turn}`` and computes GRPO advantages from each session's final output,
  broadcast to its other outputs: a sample's advantage is its episode's, except that an episode
  ended by a format violation returns only its violating turn (the paper's per-step credit).
- Every output carries the weight versions (``min_global_steps``/``max_global_steps``) verl's
  server client reported for its turn: V1 tags samples with them and fails without them.
- An invalid episode (env/verifier/judge/farm failure, lease lost) returns no samples, so it is
  dropped from its group, never scored 0. The sessions of one group run in one worker process;
  ``GroupGate`` lets them wait for each other so a group left with < 2 valid rollouts, or with
  zero reward variance, contributes nothing (the rule of ``trainer.grpo``).
- ``ServerPolicy`` adapts verl's ``LLMServerClient`` (vLLM/SGLang behind it) to our ``Policy``:
  token ids in, token ids + log-probs out, so training sees the exact sampled tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.workers.rollout.replica import TokenOutput

from envfarm.client import Farm
from trainer.episode import EpisodeResult, run_episode
from trainer.grpo import group_advantages
from trainer.judging import settle, shared_judge
from trainer.policy import ScriptedPolicy
from trainer.verl_bridge import ServerPolicy, loop_episode_config, turn_outputs
from trainer.window import DEFAULT_WINDOW

AGENT_NAME = "envfarm_agent"
AGENT_LOOP_YAML = "verl_agent_loop.yaml"
EXAMPLE_CONFIG = "verl_example.yaml"


def packaged_config(name: str = AGENT_LOOP_YAML) -> Path:
    """Path of a YAML shipped with the package (for ``agent_loop_config_path``)."""
    return Path(str(resources.files("trainer") / name))


class LocalHFServer:
    """A Hugging Face causal LM answering verl's ``generate`` in this process (CPU smoke runs,
    tests): the same interface as verl's server manager, sampling with the model itself."""

    def __init__(self, model_path: str | Path, *, device: str = "cpu") -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_path)).to(device).eval()
        self.device = device

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any], **_: Any) -> TokenOutput:
        return await asyncio.to_thread(self._generate, prompt_ids, sampling_params)

    def _generate(self, prompt_ids: list[int], params: dict[str, Any]) -> TokenOutput:
        torch = self.torch
        temperature = float(params.get("temperature", 1.0))
        eos = self.model.generation_config.eos_token_id
        ids = torch.tensor([prompt_ids], device=self.device)
        out, logprobs, past = [], [], None
        with torch.no_grad():
            for _ in range(int(params.get("max_tokens", 64))):
                res = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                past = res.past_key_values
                logits = res.logits[0, -1].float()
                if temperature > 0:
                    probs = torch.softmax(logits / temperature, -1)
                    tok = int(torch.multinomial(probs, 1))
                else:
                    tok = int(logits.argmax())
                logprobs.append(float(torch.log_softmax(logits, -1)[tok]))
                out.append(tok)
                if tok == eos:
                    break
                ids = torch.tensor([[tok]], device=self.device)
        return TokenOutput(token_ids=out, log_probs=logprobs, stop_reason="completed")


# -- GRPO group rule across the sessions of one prompt --------------------------------------------
def group_keeps(rewards: Sequence[float | None]) -> bool:
    """Does a group train? ``trainer.grpo``'s rule: invalid rewards dropped, then at least 2
    valid ones that are not all equal."""
    return any(a is not None for a in group_advantages(rewards))


@dataclass
class _Group:
    expected: int
    rewards: dict[int, float | None] = field(default_factory=dict)
    left: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


class GroupGate:
    """Where the ``n`` sessions of one GRPO group (same uid, same step) wait for each other's
    rewards. verl runs them as tasks of one worker actor, so a process-wide table suffices;
    a timeout keeps a lost sibling from hanging the step (then the arrivals so far decide)."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}

    async def arrive(self, key: str, expected: int, session: int, reward: float | None,
                     timeout_s: float) -> bool:
        group = self._groups.setdefault(key, _Group(expected))
        group.rewards[session] = reward
        if len(group.rewards) >= group.expected:
            group.done.set()
        try:
            await asyncio.wait_for(group.done.wait(), timeout_s)
        except TimeoutError:
            group.done.set()
        keeps = group_keeps(list(group.rewards.values()))
        group.left += 1
        if group.left >= len(group.rewards) and self._groups.get(key) is group:
            del self._groups[key]  # every arrival has read the verdict
        return keeps


GATE = GroupGate()
_FARMS: dict[tuple[str, int], Farm] = {}


def shared_farm(url: str) -> Farm:
    """One SDK client (one connection pool) per farm URL and event loop, not per episode."""
    key = (url, id(asyncio.get_running_loop()))
    if key not in _FARMS:
        _FARMS[key] = Farm(url)
    return _FARMS[key]


# -- the agent loop -----------------------------------------------------------------------------
@register(AGENT_NAME)
class EnvfarmAgentLoop(AgentLoopBase):
    """One farm episode per call of ``run``; one verl sample per assistant turn.

    Keyword arguments (from ``verl_agent_loop.yaml``): ``farm_url``; ``window`` (w, default 3;
    ``null``: whole history); ``max_turns`` (20); ``max_turn_tokens`` (capped by
    ``rollout.response_length``); ``policy``: ``server`` (verl's LLM servers, the default) or
    ``scripted`` (replay reference solutions: a model-free smoke run of the whole pipeline);
    ``gate_timeout_s``; ``tool_listing`` (``full``; ``compact`` for small models' contexts);
    ``max_tool_chars``; ``farm`` (an SDK ``Farm``, for embedding); ``reward_path``: ``code``
    (the farm's verify, the default) or ``llm`` with ``judge_url`` (a judge service: the
    paper's code-augmented LLM judge, see trainer/judging.py). Every prompt is measured with
    the tokenizer against ``rollout.prompt_length`` (``trainer.budget``): ``on_long_prompt``
    ``names`` (default: a tool listing that does not fit becomes names only) or ``fail``;
    ``prompt_reserve``: tokens the listing's prompt leaves for later turns (default: half).
    """

    def __init__(self, *args: Any, farm_url: str = "http://127.0.0.1:8000",
                 window: int | None = DEFAULT_WINDOW, max_turns: int = 20,
                 max_turn_tokens: int | None = None, policy: str = "server",
                 gate_timeout_s: float = 1800.0, farm: Farm | None = None,
                 tool_listing: str = "full", max_tool_chars: int = 8000,
                 name: str | None = None, reward_path: str = "code",
                 judge_url: str | None = None, on_long_prompt: str = "names",
                 prompt_reserve: int | None = None, **kwargs: Any) -> None:
        wrapped = kwargs.get("trainer_config", args[0] if args else None)
        trainer_cfg = getattr(wrapped, "config", {}).get("trainer", {}) or {}
        if not trainer_cfg.get("use_v1", False):
            raise ValueError("EnvfarmAgentLoop returns one sample per turn, which needs verl's V1 "
                             "trainer: set trainer.use_v1=true")
        if policy not in ("server", "scripted"):
            raise ValueError(f"policy must be 'server' or 'scripted', not {policy!r}")
        super().__init__(*args, **kwargs)
        self.farm_url = farm_url
        self.farm = farm
        self.policy_kind = policy
        self.episode_config = loop_episode_config(
            self.tokenizer, prompt_length=int(self.rollout_config.prompt_length),
            on_long_prompt=on_long_prompt, prompt_reserve=prompt_reserve, max_turns=max_turns,
            window=window, tool_listing=tool_listing, max_tool_chars=max_tool_chars)
        if reward_path not in ("code", "llm") or (reward_path == "llm" and not judge_url):
            raise ValueError("reward_path is 'code', or 'llm' with judge_url (a judge service)")
        self.judge_url = judge_url if reward_path == "llm" else None
        limit = int(self.rollout_config.response_length)
        self.max_turn_tokens = min(limit, max_turn_tokens or limit)
        self.gate_timeout_s = gate_timeout_s
        self.episode: EpisodeResult | None = None  # the last episode (for logs and tests)

    def _policy(self, sampling_params: dict[str, Any], env: str, task_idx: int):
        if self.policy_kind == "scripted":
            catalog = _catalog()
            return ScriptedPolicy.from_catalog(catalog)
        return ServerPolicy(self.server_manager, self.tokenizer, sampling_params,
                            max_tokens=self.max_turn_tokens)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        env, task_idx = task_of(kwargs)
        farm = self.farm or shared_farm(self.farm_url)
        policy = self._policy(sampling_params, env, task_idx)
        started = time.perf_counter()
        config = self.episode_config
        if self.judge_url:  # llm path: the slot is free while the judge service decides
            judge = shared_judge(self.judge_url, _catalog())
            config = dataclasses.replace(config, judge=judge)
        result = await run_episode(farm, policy, env, task_idx, config=config)
        await settle([result])
        self.episode = result
        reward = result.reward if result.valid else None
        if split_of(kwargs) == "train" and "uid" in kwargs and int(self.rollout_config.n) > 1:
            key = f"{kwargs.get('global_steps', -1)}:{kwargs['uid']}"
            n = int(self.rollout_config.n)
            keep = await GATE.arrive(key, n, int(kwargs.get("session_id", 0)), reward,
                                     self.gate_timeout_s)
            if not keep:
                return []
        if reward is None:
            return []  # invalid: dropped, never scored 0
        fields = turn_outputs(result, self.tokenizer, reward=float(reward),
                              global_steps=kwargs.get("global_steps"),
                              seconds=time.perf_counter() - started)
        return [AgentLoopOutput(**f, metrics=AgentLoopMetrics(
            generate_sequences=result.policy_seconds, tool_calls=result.env_seconds))
            for f in fields]


def split_of(kwargs: dict[str, Any]) -> str:
    """``train`` rows are gated as GRPO groups; ``val`` rows (see ``dataset_rows``) are not:
    verl does not tell an agent loop whether it runs a validation step."""
    return str((kwargs.get("extra_info") or {}).get("split", "train"))


@functools.cache
def _catalog() -> Any:
    from envfarm import load_catalog

    return load_catalog()


def task_of(kwargs: dict[str, Any]) -> tuple[str, int]:
    """The (env, task_idx) of a dataset row: in ``extra_info`` (see ``dataset_rows``)."""
    extra = kwargs.get("extra_info") or {}
    env = extra.get("env", kwargs.get("env"))
    idx = extra.get("task_idx", kwargs.get("task_idx"))
    if not env or idx is None:
        raise ValueError("an envfarm dataset row needs extra_info.env and extra_info.task_idx "
                         "(write one with `python -m trainer.verl_plugin dataset OUT.parquet`)")
    return str(env), int(idx)


# -- dataset ------------------------------------------------------------------------------------
def dataset_rows(catalog: Any = None, envs: Sequence[str] | None = None,
                 split: str = "train") -> list[dict[str, Any]]:
    """One verl dataset row per (env, task): the task as the prompt, the task's address (and
    the split: ``val`` rows skip the group gate) in ``extra_info``, and ``agent_name`` so verl
    runs this loop for it."""
    if catalog is None:
        from envfarm import load_catalog

        catalog = load_catalog()
    rows = []
    for env in envs or catalog.servable:
        bundle = catalog[env]
        for idx, task in enumerate(bundle.tasks):
            rows.append({"data_source": "envfarm", "agent_name": AGENT_NAME,
                         "prompt": [{"role": "user", "content": task}],
                         "extra_info": {"env": env, "task_idx": idx, "index": len(rows),
                                        "split": split}})
    return rows


def write_dataset(out: str | Path, envs: Sequence[str] | None = None, split: str = "train"
                  ) -> int:
    import pandas as pd

    rows = dataset_rows(envs=envs, split=split)
    pd.DataFrame(rows).to_parquet(out)
    return len(rows)


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m trainer.verl_plugin",
                                 description="verl plugin helpers")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ds = sub.add_parser("dataset", help="write the catalog's tasks as a verl parquet dataset")
    ds.add_argument("out")
    ds.add_argument("--env", action="append", help="only these envs (repeatable)")
    ds.add_argument("--split", choices=["train", "val"], default="train")
    sub.add_parser("paths", help="print the packaged agent-loop YAML and example config paths")
    args = ap.parse_args(argv)
    if args.cmd == "dataset":
        print(f"{write_dataset(args.out, args.env, args.split)} rows -> {args.out}")
    else:
        print(packaged_config(AGENT_LOOP_YAML))
        print(packaged_config(EXAMPLE_CONFIG))


if __name__ == "__main__":
    main()
