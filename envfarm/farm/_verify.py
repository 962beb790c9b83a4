"""Verification of a lease: the task's code-mode verifier, run outside this process.

The verifier is untrusted LLM code, so it runs in the judge's sandbox (separate worker
processes with rlimits); this module only maps its result to a reward.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from envfarm.farm._wire import VerifyResponse
from envfarm.models import Verifier


class SandboxResult(Protocol):
    ok: bool
    result: dict[str, Any] | None
    error: str | None


class Sandbox(Protocol):
    """What the farm needs of ``judge.VerifierSandbox``."""

    async def run(self, code: str, initial_db: bytes, final_db: bytes,
                  final_answer: str | None = None) -> SandboxResult: ...

    def close(self) -> None: ...


class LazySandbox:
    """Starts the sandbox's worker processes on the first verification, not at farm start-up."""

    def __init__(self, workers: int, timeout_s: float) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self._sandbox: Sandbox | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Sandbox:
        async with self._lock:
            if self._sandbox is None:
                # Imported here: the judge package is optional for a farm that never verifies.
                from judge.sandbox import VerifierSandbox

                self._sandbox = await asyncio.to_thread(
                    VerifierSandbox, workers=self.workers, timeout_s=self.timeout_s)
            return self._sandbox

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None


async def verify(sandbox: LazySandbox, verifier: Verifier | None, task_idx: int,
                 initial_db: bytes, final_db: bytes, final_answer: str | None) -> VerifyResponse:
    """Run one code-mode verifier; the judge maps its result to outcome and reward (the one
    mapping: completed 1.0, not completed 0.0, a failed verifier invalid with reward null)."""
    from judge import Outcome, Verdict, code_only_verdict

    if verifier is None:
        verdict = Verdict.of(Outcome.invalid, f"task {task_idx} has no code-mode verifier in the "
                             "catalog", error_kind="verifier_error")
        return _response(task_idx, verdict, {"error": verdict.reason})
    box = await sandbox.get()
    res = await box.run(verifier.code, initial_db, final_db, final_answer=final_answer)
    if not res.ok or res.result is None:
        verdict = Verdict.of(Outcome.invalid, res.error or "verifier failed",
                             error_kind="verifier_error")
        return _response(task_idx, verdict, {"error": verdict.reason,
                                             "error_kind": _value(res, "error_kind")})
    return _response(task_idx, code_only_verdict(res), res.result)


def _response(task_idx: int, verdict: Any, details: dict[str, Any]) -> VerifyResponse:
    return VerifyResponse(task_idx=task_idx, outcome=verdict.outcome.value, reward=verdict.reward,
                          valid=verdict.valid, reason=verdict.reason, details=details)


def _value(res: object, name: str) -> Any:
    value = getattr(res, name, None)
    return getattr(value, "value", value)
