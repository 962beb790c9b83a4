"""The judge: sandboxed verifications/s, fresh verifier processes, LLM judging overlapped with rollouts, code-only vs code-augmented agreement."""
