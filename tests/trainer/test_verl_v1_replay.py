"""The verl plugin's outputs through verl 0.9.1's V1 step bookkeeping, replayed without verl.

verl is the ``gpu`` extra and not in the default venv, so what V1 does with an agent loop's
outputs is restated here from verl 0.9.1's source (read, not copied):
``verl/trainer/ppo/v1/agent_loop_tq.py`` (``AgentLoopWorkerTQ._agent_loop_postprocess``: the
last output's reward and ``reward_extra_info`` copied to the others, keys ``{uid}_{session}_{i}``,
tags from ``extra_fields``), ``verl/trainer/ppo/v1/trainer_base.py`` (``_compute_metrics``:
``np.array([tag["min_global_steps"] ...], dtype=int)`` every step), ``verl/trainer/ppo/v1/
utils.py`` (``compute_advantage_for_multi_trajectories``: GRPO over each session's last output,
broadcast to the session's rows) and ``AgentLoopOutput.as_dict`` (the reward on the last
response token). The episodes are real: the agent loop against the in-process farm, turns from
``ServerPolicy`` over a server that answers the way verl's ``LLMServerClient`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from judge import Message
from trainer.episode import run_episode
from trainer.format import call_tool_text, tool_call_text
from trainer.grpo import step_advantages
from trainer.policy import Generation, ScriptedPolicy, TurnContext
from trainer.train import rollout_samples
from trainer.verl_bridge import ServerPolicy, turn_outputs

ENV = "hotel_booking_1"


# -- verl 0.9.1's V1 handling, restated ----------------------------------------------------------
def v1_postprocess(outputs: list[dict[str, Any]], uid: str, session: int, global_steps: int
                   ) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """AgentLoopWorkerTQ._agent_loop_postprocess: (keys, fields, tags) put in the queue."""
    assert outputs, "an empty list is logged and skipped by V1"
    final = outputs[-1]
    if final["reward_score"] is not None:
        for out in outputs[:-1]:
            out["reward_score"] = final["reward_score"]
            out["extra_fields"]["reward_extra_info"] = final["extra_fields"]["reward_extra_info"]
    keys, fields, tags = [], [], []
    for i, out in enumerate(outputs):
        keys.append(f"{uid}_{session}_{i}")
        rm = torch.zeros(len(out["response_ids"]))
        rm[-1] = out["reward_score"]  # as_dict: the reward on the last response token
        fields.append({**out, "rm_scores": rm,
                       "response_mask": torch.tensor(out["response_mask"])})
        tags.append({"status": "success", "prompt_len": len(out["prompt_ids"]),
                     "response_len": len(out["response_ids"]),
                     "seq_len": len(out["prompt_ids"]) + len(out["response_ids"]),
                     "global_steps": global_steps,
                     "min_global_steps": out["extra_fields"].get("min_global_steps"),
                     "max_global_steps": out["extra_fields"].get("max_global_steps")})
    return keys, fields, tags


def v1_staleness(tags: list[dict[str, Any]], global_steps: int) -> dict[str, float]:
    """trainer_base._compute_metrics, its off-policy part (raises TypeError on a None)."""
    lo = np.array([t["min_global_steps"] for t in tags], dtype=int)
    hi = np.array([t["max_global_steps"] for t in tags], dtype=int)
    return {"spans_max": float((hi - lo + 1).max()),
            "staleness_max": float(((global_steps - 1) - lo).max())}


def v1_advantages(keys: list[str], fields: list[dict[str, Any]]) -> list[float]:
    """compute_advantage_for_multi_trajectories (GRPO): each session's last output (highest
    index) scores its session; GRPO over the sessions of a uid (torch.std, unbiased, as
    verl's compute_grpo_outcome_advantage); the score broadcast to every row of the session."""
    last: dict[str, tuple[int, int]] = {}
    for row, key in enumerate(keys):
        uid, session, index = key.rsplit("_", 2)
        if f"{uid}_{session}" not in last or last[f"{uid}_{session}"][0] < int(index):
            last[f"{uid}_{session}"] = (int(index), row)
    by_uid: dict[str, list[float]] = {}
    for skey, (_, row) in last.items():
        by_uid.setdefault(skey.rsplit("_", 1)[0], []).append(float(fields[row]["rm_scores"].sum()))
    score = {}
    for skey, (_, row) in last.items():
        group = torch.tensor(by_uid[skey.rsplit("_", 1)[0]])
        mean, std = group.mean(), group.std() if len(group) > 1 else torch.tensor(1.0)
        score[skey] = float((fields[row]["rm_scores"].sum() - mean) / (std + 1e-6))
    return [score[key.rsplit("_", 1)[0]] for key in keys]


# -- policies ------------------------------------------------------------------------------------
@dataclass
class TokenOutput:
    """The shape of verl's ``TokenOutput`` that ServerPolicy reads."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


class ReplayServer:
    """Answers verl's ``generate`` with the given texts' tokens, and the weight versions as
    verl's LLMServerClient.generate reports them (global_steps, then min/max set from it)."""

    def __init__(self, tokenizer, texts: list[str], version: int) -> None:
        self.tokenizer, self.texts, self.version, self.calls = tokenizer, texts, version, 0

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any]) -> TokenOutput:
        text = self.texts[min(self.calls, len(self.texts) - 1)]
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return TokenOutput(ids, [-0.5] * len(ids),
                           {"global_steps": self.version, "min_global_steps": self.version,
                            "max_global_steps": self.version})


class Lines:
    async def generate(self, messages: list[Message], ctx: TurnContext) -> Generation:
        texts = [tool_call_text("list_tools", {}, "I list the tools."), "no tags, no call"]
        return Generation(text=texts[min(ctx.turn, 1)])


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


LIST = tool_call_text("list_tools", {}, "I list the tools.")


async def test_server_turns_carry_the_weight_versions_v1_tags(farm, tokenizer):
    server = ReplayServer(tokenizer, [LIST, call_tool_text("search_hotels", {"city": "Lisbon"},
                                                           "Search.")] + ["no call at all"],
                          version=6)
    policy = ServerPolicy(server, tokenizer, {"temperature": 1.0}, max_tokens=256)
    ep = await run_episode(farm, policy, ENV, 0)
    assert ep.valid and ep.outcome == "format_error" and len(ep.turns) == 3
    outs = turn_outputs(ep, tokenizer, reward=ep.reward, global_steps=7)
    # the paper's credit: the violation's -1 goes to the violating turn only
    assert [o["extra_fields"]["turn"] for o in outs] == [2]
    assert outs[0]["response_ids"] == ep.turns[2].generation.completion_ids
    assert outs[0]["response_logprobs"] == [-0.5] * len(outs[0]["response_ids"])
    _, _, tags = v1_postprocess(outs, "u1", 0, global_steps=7)
    assert v1_staleness(tags, global_steps=7) == {"spans_max": 1.0, "staleness_max": 0.0}
    assert tags[0]["min_global_steps"] == tags[0]["max_global_steps"] == 6


def test_outputs_without_versions_fail_v1s_step_one():
    """What the plugin returned before: the replay raises V1's TypeError, so it can tell."""
    outs = [{"prompt_ids": [1], "response_ids": [2], "response_mask": [1],
             "reward_score": 1.0, "extra_fields": {"reward_extra_info": {}}}]
    _, _, tags = v1_postprocess(outs, "u", 0, global_steps=1)
    with pytest.raises(TypeError):
        v1_staleness(tags, global_steps=1)


async def test_a_group_through_v1_gets_the_papers_per_step_credit(farm, tokenizer,
                                                                  bundled_catalog):
    """Session 0 solves the task (a scripted replay: no server, versions from the row),
    session 1 lists the tools and then breaks the format. Through V1: every row of session 0
    has the same positive advantage; session 1 has one row, the violating turn, negative. The
    CPU trainer's samples of the same group have the same credit pattern (0 on the correct
    list_tools)."""
    good = await run_episode(farm, ScriptedPolicy.from_catalog(bundled_catalog), ENV, 1)
    bad = await run_episode(farm, Lines(), ENV, 1)
    assert good.success and bad.outcome == "format_error" and len(bad.turns) == 2
    keys, fields, tags = [], [], []
    for session, ep in enumerate((good, bad)):
        outs = turn_outputs(ep, tokenizer, reward=ep.reward, global_steps=3)
        k, f, t = v1_postprocess(outs, "uidA", session, global_steps=3)
        keys += k
        fields += f
        tags += t
    assert v1_staleness(tags, global_steps=3)["spans_max"] == 1.0
    adv = v1_advantages(keys, fields)
    rows0 = [a for k, a in zip(keys, adv) if k.startswith("uidA_0_")]
    rows1 = [a for k, a in zip(keys, adv) if k.startswith("uidA_1_")]
    assert len(rows0) == len(good.turns) and len(set(rows0)) == 1 and rows0[0] > 0
    assert len(rows1) == 1 and rows1[0] == pytest.approx(-rows0[0])
    assert all(f["reward_score"] == 1.0 for f in fields[:len(rows0)])
    # the CPU trainer: the same credit, the earlier turns present with advantage 0
    samples, used = rollout_samples([[good, bad]], tokenizer)
    assert used == 1
    advs = [s.advantage for s in samples]
    n = len(good.turns)
    assert advs[:n] == pytest.approx([1.0] * n, abs=1e-4)
    assert advs[n:] == pytest.approx(step_advantages(-1.0, 2, violated=True), abs=1e-4)
    assert advs[n:][0] == 0.0
