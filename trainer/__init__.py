"""The trainer: agent loop, rollouts against the farm, history-windowed GRPO (see DESIGN.md).

Not built yet: no issue has asked for it so far. The judge already defines the trajectory
model (``judge.Trajectory``) and the rewards (``judge.reward_for``) the trainer will use.
"""
