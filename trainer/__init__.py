"""The trainer: agent loop, rollouts against the farm, history-windowed GRPO (see
docs/architecture.md and docs/training.md).

    from trainer.episode import run_episode          # one episode against the farm
    from trainer.policy import OpenAIPolicy, ScriptedPolicy
    from trainer.hf import HFPolicy                  # local transformers model
    from trainer.grpo import group_advantages, grpo_step
    from trainer.window import window, samples       # same truncation at rollout and training

Only ``trainer.actor`` imports Ray. Heavy dependencies (torch, transformers) load on use.
"""
