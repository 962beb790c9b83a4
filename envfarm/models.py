"""Typed records of an environment bundle (AWM's on-disk format) and of tool calls."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CallResult",
    "Criteria",
    "DBSchema",
    "EnvBundle",
    "SampleData",
    "TableSample",
    "TableSchema",
    "ToolCall",
    "ToolError",
    "ToolSpec",
    "Verifier",
    "parse_raw_response",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _AWMRecord(BaseModel):
    # AWM records carry optional classifier/bookkeeping fields we keep but do not interpret.
    model_config = ConfigDict(extra="allow")


class TableSchema(_AWMRecord):
    name: str = Field(description="Table name.")
    ddl: str = Field(description="CREATE TABLE statement.")
    indexes: list[str] = Field(default_factory=list, description="CREATE INDEX statements.")


class DBSchema(_AWMRecord):
    tables: list[TableSchema] = Field(default_factory=list)


class TableSample(_AWMRecord):
    table_name: str
    reasoning: str = ""
    insert_statements: list[str] = Field(default_factory=list)


class SampleData(_AWMRecord):
    tables: list[TableSample] = Field(default_factory=list)


class Verifier(_Model):
    """One task's verifier code (sql mode ``verify_task`` or code mode ``verify_task_completion``)."""

    task_idx: int
    task: str = ""
    code: str
    raw_response: str = ""

    @property
    def criteria(self) -> dict[str, Any]:
        """The criteria AWM's raw_response gives (``parse_raw_response``), the ones it has."""
        return parse_raw_response(self.raw_response).model_dump(exclude_none=True)


class Criteria(_Model):
    """Success/failure criteria an sql-mode verifier comes with (from AWM's raw_response)."""

    function_name: str | None = Field(default=None, description="function the code defines")
    success_criteria: str | None = Field(default=None, description="what success looks like")
    failure_criteria: str | None = Field(default=None, description="what failure looks like")
    reasoning: str | None = Field(default=None, description="the verifier author's reasoning")


def parse_raw_response(raw: str | None) -> Criteria:
    """AWM's ``raw_response`` is a JSON object for sql mode and often empty for code mode."""
    if not raw or not raw.strip():
        return Criteria()
    try:
        data = json.loads(raw)
    except ValueError:
        return Criteria()
    if not isinstance(data, dict):
        return Criteria()

    def text(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) and value.strip() else None

    return Criteria(
        function_name=text("function_name"),
        success_criteria=text("success_criteria"),
        failure_criteria=text("failure_criteria"),
        reasoning=text("reasoning"),
    )


class ToolCall(_Model):
    """One call of a tool: the tool's name and its flat JSON arguments."""

    tool: str = Field(description="Tool name (the FastAPI operation_id).")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Flat JSON arguments.")


class EnvBundle(_Model):
    """Everything the catalog knows about one environment; any part may be missing."""

    name: str = Field(description="AWM-normalized scenario name.")
    description: str = ""
    tasks: list[str] = Field(default_factory=list)
    db_schema: DBSchema | None = None
    sample_data: SampleData | None = None
    api_spec: dict[str, Any] | None = None
    code: str | None = Field(default=None, description="full_code: one FastAPI module.")
    verifiers: dict[int, Verifier] = Field(default_factory=dict, description="sql mode, by task.")
    code_verifiers: dict[int, Verifier] = Field(default_factory=dict, description="code mode.")
    solutions: dict[int, list[ToolCall]] = Field(default_factory=dict)
    solution_answers: dict[int, str] = Field(default_factory=dict, description=(
        "Final answer of a reference solution, by task (read-only tasks are judged on it)."))
    task_states: dict[int, dict[str, list[int]]] = Field(default_factory=dict, description=(
        "A task's own starting database, as the rows of the env's sample database it lacks "
        "(table -> rowids; gen_task_states.jsonl): EnvFactory derives one per scenario. A lease "
        "of that task starts, resets and is verified from it."))
    flagged: dict[int, str] = Field(default_factory=dict, description=(
        "Tasks the catalog's hack-probe report flags (gen_probes.jsonl: a probe passes their "
        "verifier, or it cannot judge one), by task, with why: a farm quarantines them at load."))
    problems: list[str] = Field(default_factory=list, description="What is missing or broken.")

    @property
    def servable(self) -> bool:
        return self.code is not None


class ToolSpec(_Model):
    """A tool as an agent sees it."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolError(_Model):
    kind: Literal["agent_error", "env_error"]
    message: str


class CallResult(_Model):
    """Outcome of one tool call: a result, or a typed error; never an exception."""

    ok: bool
    result: Any = None
    error: ToolError | None = None
    status: int | None = Field(default=None, description="HTTP status the env answered.")
    elapsed_ms: float = 0.0
