"""TRL's ``GRPOTrainer`` on its OpenEnv rollout path (``environment_factory``), against the farm's
OpenEnv endpoint: what a TRL user of OpenEnv's AWM env runs, with the URL changed.

    envfarm serve --no-ray --envs hotel_booking_1 &                        # the farm
    python -m trainer.trl_openenv --url http://127.0.0.1:8000 --steps 2    # CPU, tiny model

TRL makes one ``FarmEnv`` per rollout slot and reuses it: ``reset(scenario, task_idx)`` (the
dataset's columns) opens or resets the socket's lease and returns the task for the prompt; the
public methods ``list_tools`` and ``call_tool`` are the agent's tools (the AWM paper's two
meta-tools); ``get_reward`` verifies the episode on the farm (the hidden ``verify`` tool; an
invalid verdict is ``None``, which TRL leaves out of the group). Needs the ``openenv`` extra
(openenv-core, trl). The GPU recipe is in docs/openenv.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from envfarm.client import openenv_base_url

PROMPT = ("You are an agent that completes the user's task with the environment's tools. Call "
          "list_tools first, then call_tool as often as needed, then answer.")


def farm_env_class(base_url: str) -> type:
    """The environment class TRL instantiates (its ``__init__`` takes no argument, so the
    farm's address is closed over here)."""
    from openenv.core.client_types import StepResult
    from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
    from openenv.core.mcp_client import MCPToolClient

    class AWMClient(MCPToolClient):
        """openenv-core's client, keeping every AWM observation field (as OpenEnv's ``AWMEnv``
        does; the base class keeps only MCP's)."""

        def _parse_result(self, payload: dict[str, Any]) -> StepResult:
            return StepResult(observation=payload.get("observation", {}),
                              reward=payload.get("reward"), done=payload.get("done", False))

    class FarmEnv:
        def __init__(self) -> None:
            self._client = AWMClient(base_url=base_url).sync()
            self._client.connect()

        def reset(self, scenario: str, task_idx: int, **_: Any) -> str:
            obs = self._client.reset(scenario=scenario, task_idx=int(task_idx)).observation
            if obs.get("reward_type") != "reset_ok":
                raise RuntimeError(f"the farm refused the episode: {obs.get('error')}")
            return f"Task: {obs['task']}"

        def list_tools(self) -> str:
            """List the environment's tools.

            Returns:
                The tools as JSON: the name, description and input_schema of each.
            """
            obs = self._client.step(ListToolsAction()).observation
            return json.dumps(obs.get("tools", []))

        def call_tool(self, tool_name: str, arguments: str) -> str:
            """Call one of the environment's tools.

            Args:
                tool_name: The tool's name, as list_tools gives it.
                arguments: The tool's arguments, a JSON object as a string.

            Returns:
                The tool's answer as JSON.
            """
            try:
                args = json.loads(arguments) if arguments else {}
            except ValueError as exc:
                raise ValueError(f"arguments are not JSON: {exc}") from None
            action = CallToolAction(tool_name=tool_name,
                                    arguments=args if isinstance(args, dict) else {})
            obs = self._client.step(action).observation
            if obs.get("error"):
                raise ValueError(obs["error"])  # TRL hands the message back to the model
            return str(obs.get("tool_result"))

        def get_reward(self) -> float | None:
            return self._client.step(CallToolAction(tool_name="verify")).reward

    return FarmEnv


def dataset(env: str, tasks: int, rows: int) -> Any:
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": PROMPT}],
                               "scenario": env, "task_idx": i % tasks} for i in range(rows)])


def tokenizer_for(model: str) -> Any:
    """The model's tokenizer. The tiny model's template is envfarm's agent format; for TRL it
    gets Qwen3's own (its special tokens are Qwen3's), whose tool calls TRL parses."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    from trainer.format import CHAT_TEMPLATE

    tok = AutoTokenizer.from_pretrained(model)
    if tok.chat_template == CHAT_TEMPLATE:
        tok.chat_template = qwen3_chat_template
    return tok


def train(url: str, env: str = "hotel_booking_1", *, model: str | None = None,
          key: str | None = None, steps: int = 2, tasks: int = 10, generations: int = 2,
          completion_tokens: int = 32, out_dir: str | Path = "runs/trl_openenv",
          **config: Any) -> list[dict[str, Any]]:
    """Run GRPO for ``steps`` steps; the trainer's log history. ``model``: a Hugging Face
    checkpoint (path or hub id); default: the tiny model (CPU). ``config``: more GRPOConfig."""
    from trl import GRPOConfig, GRPOTrainer

    if model is None:
        from trainer.tiny_model import tiny_model_path

        model = str(tiny_model_path())
    args = GRPOConfig(
        output_dir=str(out_dir), max_steps=steps, per_device_train_batch_size=generations,
        num_generations=generations, max_completion_length=completion_tokens,
        learning_rate=1e-5, logging_steps=1, report_to="none", save_strategy="no",
        chat_template_kwargs={"enable_thinking": False}, seed=0, **config)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer_for(model), args=args,
                          train_dataset=dataset(env, tasks, rows=steps * generations * 4),
                          environment_factory=farm_env_class(openenv_base_url(url, key)))
    trainer.train()
    return trainer.state.log_history


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--env", default="hotel_booking_1")
    parser.add_argument("--key", default=None, help="tenant key (default: none, a dev farm)")
    parser.add_argument("--model", default=None, help="checkpoint; default: the tiny model")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--completion-tokens", type=int, default=32,
                        help="tokens of a whole multi-turn completion (tool results included)")
    parser.add_argument("--vllm", action="store_true",
                        help="GPU: generate with vLLM colocated (pip install 'trl[vllm]')")
    parser.add_argument("--out-dir", default="runs/trl_openenv")
    a = parser.parse_args(argv)
    config: dict[str, Any] = {"use_cpu": a.model is None and not a.vllm}
    if a.vllm:
        config.update(use_vllm=True, vllm_mode="colocate", bf16=True)
    for row in train(a.url, a.env, model=a.model, key=a.key, steps=a.steps,
                     generations=a.generations, completion_tokens=a.completion_tokens,
                     out_dir=a.out_dir, **config):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
