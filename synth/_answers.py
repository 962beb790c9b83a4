"""The shape of every LLM answer a stage reads, as pydantic models.

LLM JSON is untrusted input: ``bool("false")`` is True and ``int("first")`` raises far from any
error handling. Each stage validates its answer here; an answer that does not fit is a
:class:`~synth._parse.ParseError`, which sends it down the stage's parse-error / repair path.
Free-text fields take any JSON value (written back as text); fields the code acts on are strict.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from synth._parse import ParseError, extract_json


def _as_text(value: Any) -> Any:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def _none_as_empty(value: Any) -> Any:
    return [] if value is None else value


#: Prose the code only shows or stores (reasoning, criteria, summaries).
Text = Annotated[str, BeforeValidator(_as_text)]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ScenarioCandidate(_Answer):
    name: str = Field(min_length=1)
    description: str = Field(min_length=1)
    category: str | None = None


class ScenarioVerdict(_Answer):
    index: int
    crud_suitable: bool  # pydantic reads "false"/"no"/0 as False and refuses "maybe"
    category: str | None = None
    reason: Text = ""


class ClassifierAnswer(_Answer):
    results: list[ScenarioVerdict]


class TaskAnswer(_Answer):
    tasks: list[str]


class TableDDL(_Answer):
    name: str
    ddl: str
    indexes: Annotated[list[str], BeforeValidator(_none_as_empty)] = []


class DbAnswer(_Answer):
    tables: list[TableDDL] = Field(min_length=1)


class TableRows(_Answer):
    table_name: str
    reasoning: Text = ""
    insert_statements: list[str]


class SampleAnswer(_Answer):
    tables: list[TableRows] = Field(min_length=1)


class RowsAnswer(_Answer):
    """Extra rows the gate asked for (may be empty: the repair then has nothing to add)."""

    tables: list[TableRows]


class ApiGroup(BaseModel):
    model_config = ConfigDict(extra="allow")

    group_name: Text = ""
    endpoints: list[dict[str, Any]]


class SpecAnswer(BaseModel):
    """Only the structure ``validate_spec`` walks; its content rules live there."""

    model_config = ConfigDict(extra="allow")

    api_groups: list[ApiGroup] = Field(min_length=1)


class VerifierAnswer(_Answer):
    reasoning: Text = ""
    success_criteria: Text = ""
    failure_criteria: Text = ""
    sql_verifier: str
    code_verifier: str


class SolutionCall(_Answer):
    tool: str = Field(min_length=1)
    arguments: Annotated[dict[str, Any], BeforeValidator(lambda v: {} if v is None else v)] = {}


class SolutionAnswer(_Answer):
    solution: list[SolutionCall]
    final_answer: Annotated[str | None, BeforeValidator(lambda v: v if v is None else _as_text(v))] = None


class FixSummary(_Answer):
    root_cause: Text = ""
    problem_code: Text = ""
    guidance: Text = ""
    fix_target: Annotated[Literal["solution", "verifier", "data"] | None,
                          BeforeValidator(lambda v: v.strip().lower() if isinstance(v, str) else None)] = None


M = TypeVar("M", bound=BaseModel)


def parse_answer(text: str, model: type[M]) -> M:
    """``model`` from the JSON object in ``text``; ParseError (with where it went wrong) otherwise."""
    return validate_answer(extract_json(text), model)


def validate_answer(data: Any, model: type[M]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}" for e in exc.errors()[:5]]
        raise ParseError("the answer does not have the requested shape: " + "; ".join(problems)) from None


def fix_target(summary: dict[str, Any]) -> str | None:
    """The repair target an error summary names, if it names a known one."""
    try:
        return FixSummary.model_validate(summary).fix_target
    except ValidationError:
        return None
