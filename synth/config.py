"""Configuration of a synthesis run (defaults defined once, here)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: The per-scenario stages in pipeline order (``scenario`` runs before them, once per run).
SCENARIO_STAGES: tuple[str, ...] = ("task", "db", "sample", "spec", "env", "verifier")
STAGES: tuple[str, ...] = ("scenario", *SCENARIO_STAGES)

#: Output file of each stage (AWM names), plus envfarm's extra files.
FILES: dict[str, str] = {
    "scenario": "gen_scenario.jsonl",
    "task": "gen_tasks.jsonl",
    "db": "gen_db.jsonl",
    "sample": "gen_sample.jsonl",
    "spec": "gen_spec.jsonl",
    "env": "gen_envs.jsonl",
    "verifier": "gen_verifier.jsonl",
    "code_verifier": "gen_verifier.pure_code.jsonl",
    "solution": "gen_solutions.jsonl",
    "report": "synth_report.jsonl",
}


class SynthConfig(BaseModel):
    """Everything a run needs besides the LLM endpoint (see ``envfarm.llm.LLMConfig``)."""

    model_config = ConfigDict(extra="forbid")

    out_dir: Path = Field(description="folder of the AWM JSONL files this run reads and appends to")
    seed_file: Path | None = Field(None, description="seed scenarios JSONL ({name, description}); None = packaged list")
    target_count: int = Field(10, ge=1, description="scenarios to accept in the scenario stage")
    tasks_per_scenario: int = Field(10, ge=1, description="k tasks per scenario")
    max_attempts: int = Field(5, ge=1, description="self-correction attempts per executable stage")
    max_failure_rate: float = Field(0.10, ge=0, le=1, description="db/sample: accept when at most this share fails")
    concurrency: int = Field(8, ge=1, description="scenarios in flight at once")
    # scenario stage
    candidates_per_round: int = Field(10, ge=1, description="scenarios asked for per Self-Instruct round")
    seeds_in_prompt: int = Field(8, ge=1, description="seed examples shown per round")
    dedup_threshold: float = Field(0.85, gt=0, le=1, description="reject a scenario this similar (cosine) to an accepted one")
    category_share: float = Field(0.2, gt=0, le=1, description="at most this share of target_count per category")
    stall_rounds: int = Field(2, ge=1, description="rounds without progress before caps are relaxed")
    max_rounds: int = Field(50, ge=1, description="give up the scenario stage after this many rounds")
    embedder: Literal["local", "endpoint", "none"] = Field("local", description="dedup embeddings: offline MiniLM, the endpoint, or off")
    # verifier stage / acceptance gate
    gate: bool = Field(True, description="prove each task solvable with a reference solution")
    gate_attempts: int = Field(5, ge=1, description="repairs of verifier/solution per task before dropping it")
    sandbox_workers: int = Field(2, ge=1, description="verifier sandbox worker processes")
    verifier_timeout_s: float = Field(10.0, gt=0, description="wall-clock limit per verifier run")
    tool_timeout_s: float = Field(10.0, gt=0, description="per tool call when probing envs and running solutions")
    retry_failed: bool = Field(False, description="re-run scenario stages whose last run failed")
    progress: bool = Field(True, description="show a progress bar per stage")
    temperature: float = Field(0.7, ge=0, le=2, description="generation temperature")
    fix_temperature: float = Field(0.2, ge=0, le=2, description="temperature of error summaries and repairs")

    def path(self, what: str) -> Path:
        """The file of a stage or extra (see ``FILES``)."""
        return self.out_dir / FILES[what]
