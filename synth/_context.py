"""What every stage gets: config, LLM client, output stores, report store, sandbox, metering."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from envfarm.llm import ChatResult, LLMClient
from synth._jsonl import JsonlStore, by_name, by_scenario, by_task
from synth._usage import count_call
from synth.config import FILES, SynthConfig
from synth.report import StageReport, report_key


@dataclass
class Meter:
    """LLM usage and wall time of one stage run (goes into its report record)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def add(self, res: ChatResult) -> None:
        count_call(self, res)

    def report(self, **fields: Any) -> StageReport:
        """A report record carrying this meter's numbers."""
        return StageReport(
            llm_calls=self.calls, prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
            cost_usd=self.cost_usd, elapsed_s=time.perf_counter() - self.started, **fields,
        )


class Stores:
    """The run's JSONL files, opened once (each repairs a torn tail and indexes its keys)."""

    def __init__(self, config: SynthConfig) -> None:
        p = config.path
        self.scenario = JsonlStore(p("scenario"), by_name)
        self.task = JsonlStore(p("task"), by_scenario)
        self.db = JsonlStore(p("db"), by_scenario)
        self.sample = JsonlStore(p("sample"), by_scenario)
        self.spec = JsonlStore(p("spec"), by_scenario)
        self.env = JsonlStore(p("env"), by_scenario)
        self.verifier = JsonlStore(p("verifier"), by_task)
        self.code_verifier = JsonlStore(p("code_verifier"), by_task)
        self.solution = JsonlStore(p("solution"), by_task)
        self.report = JsonlStore(config.out_dir / FILES["report"], report_key)

    def output(self, stage: str) -> JsonlStore:
        """The per-scenario output store of a stage (verifier: the code-mode file)."""
        return self.code_verifier if stage == "verifier" else getattr(self, stage)


@dataclass
class RunContext:
    """Shared by every stage of one run."""

    config: SynthConfig
    llm: LLMClient | None
    stores: Stores
    sandbox: Any = None  # judge.VerifierSandbox, opened lazily by the verifier stage
    embedder: Any = None

    async def chat(self, meter: Meter, messages: list[dict[str, Any]], *, stage: str, scenario: str | None,
                   json_mode: bool = True, temperature: float | None = None, salt: str | None = None) -> str:
        """One LLM call, metered; ``json_mode`` asks for a JSON object."""
        if self.llm is None:
            from envfarm.errors import LLMError

            raise LLMError("this stage needs an LLM endpoint; none is configured")
        res = await self.llm.chat(
            messages, stage=stage, scenario=scenario,
            response_format={"type": "json_object"} if json_mode else None,
            temperature=self.config.temperature if temperature is None else temperature, salt=salt,
        )
        meter.add(res)
        return res.text

    def get_sandbox(self) -> Any:
        """The run's verifier sandbox (``judge.VerifierSandbox``), started on first use."""
        if self.sandbox is None:
            from judge import (
                VerifierSandbox,  # the judge's sandbox: verifier code never runs here
            )

            self.sandbox = VerifierSandbox(workers=self.config.sandbox_workers, timeout_s=self.config.verifier_timeout_s)
        return self.sandbox

    def close(self) -> None:
        """Stop the sandbox workers."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def record(self, report: StageReport) -> None:
        """Append a report record (once per key)."""
        self.stores.report.append_once(report.model_dump(mode="json"))

    def stage_done(self, stage: str, scenario: str) -> bool:
        """Output exists, or the stage failed for good and failures are not retried."""
        if scenario in self.stores.output(stage) and stage != "verifier":
            return True
        rec = self.stores.report.get((stage, scenario, None))
        if rec is None:
            return False
        return bool(rec["ok"]) or not self.config.retry_failed
