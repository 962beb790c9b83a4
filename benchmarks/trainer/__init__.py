"""The trainer: 1,024 scripted episodes against the farm and AWM's way, the GRPO step's time and memory."""
