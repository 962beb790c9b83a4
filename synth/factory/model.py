"""The records EnvFactory's stages hand each other (one file per env beside AWM's JSONL files).

``<out>/factory/<env>/tool_graph.json``  one ``ToolGraph``
``<out>/factory/<env>/chains.jsonl``     one ``Chain`` per line (sampled, deterministic under a seed)
``<out>/factory/<env>/episodes.jsonl``   one ``Episode`` per line (executed, written, gated)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Param(BaseModel):
    name: str
    type: str = "string"          # JSON-schema type of the tool's input parameter
    required: bool = False
    description: str = ""
    #: internal (system state an earlier call returns) or external (the user states it); required params only
    kind: Literal["internal", "external"] | None = None
    #: who classified it: the LLM, or the name rule (no LLM, or it gave no usable answer)
    kind_source: Literal["llm", "regex"] | None = None


class Field_(BaseModel):
    """One field of a tool's JSON response; ``path`` is dotted, ``[]`` marks a list item."""

    path: str
    type: str = "string"
    description: str = ""


class Node(BaseModel):
    tool: str
    description: str = ""
    params: list[Param] = Field(default_factory=list)
    fields: list[Field_] = Field(default_factory=list)
    #: where ``fields`` came from: the OpenAPI response model, executing the tool, or nowhere
    fields_source: Literal["schema", "probe", "none"] = "none"
    #: why ``fields_source`` is "none" (probe failed with ...), for the report
    note: str = ""


EdgeSource = Literal["embedding", "name", "llm"]


class Edge(BaseModel):
    """``src.field`` can feed ``dst.param``; with both empty, a *logical* edge: ``dst`` follows ``src`` in a
    workflow though no value passes (a tool that takes or returns no data, e.g. ``delete_all_notes``)."""

    src: str
    field: str
    dst: str
    param: str
    score: float = 0.0
    source: EdgeSource
    kept: bool = False
    #: the LLM's reason for keeping or rejecting, when it ruled
    reason: str = ""
    #: what proposed the edge ("name", "embedding", or "llm": the LLM added it) when ``source`` is "llm"
    found_by: str = ""

    @property
    def logical(self) -> bool:
        return not self.param


class ToolGraph(BaseModel):
    env: str
    nodes: list[Node]
    edges: list[Edge]
    threshold: float
    stats: dict[str, Any] = Field(default_factory=dict)

    def kept(self) -> list[Edge]:
        return [e for e in self.edges if e.kept]


class Binding(BaseModel):
    """Where a chain step's parameter value comes from."""

    kind: Literal["step", "db", "task"]
    step: int | None = None        # kind == "step": index of an earlier step
    field: str | None = None       # kind == "step": dotted path into that step's response
    table: str | None = None       # kind == "db": a value present in the initial database
    column: str | None = None
    #: kind == "task": a value the user states in the request (a name, an amount, a date)


class Step(BaseModel):
    tool: str
    bindings: dict[str, Binding] = Field(default_factory=dict)


class Chain(BaseModel):
    env: str
    chain_id: str                  # stable: hash of (env, steps), so resumes dedupe
    steps: list[Step]


class Call(BaseModel):
    tool: str
    arguments: dict[str, Any]
    result: Any = None
    ok: bool = True
    #: the call changed the database (None: not recorded, older files)
    changed: bool | None = None


class Episode(BaseModel):
    env: str
    chain_id: str
    calls: list[Call]              # the executed ground-truth trajectory
    messages: list[str]            # the user's first message, then follow-ups (implicit intent)
    #: calls each message asks for, in order, as QueryGen planned them ([] in older files)
    turn_calls: list[int] = Field(default_factory=list)
    #: QueryGen's stages: profile, scenario, per turn subgoals, goal and message ({} in older files)
    query: dict[str, Any] = Field(default_factory=dict)
    verifier_code: str             # AWM code mode: verify_task_completion(initial, final, final_answer=None)
    #: AWM sql mode: verify_task(initial, final) -> facts for the LLM judge ("" when not made)
    sql_verifier_code: str = ""
    final_answer: str | None = None
    accepted: bool = False
    reason: str = ""               # why rejected, for the report
    detail: str = ""               # the failing call, gate problem or leak behind ``reason``
    #: LLM usage of writing this episode's request (prompt_tokens, completion_tokens, cost_usd)
    usage: dict[str, float] = Field(default_factory=dict)
    #: the scenario's own starting database: the rows of the env's sample data it lacks ({}: all)
    task_state: dict[str, list[int]] = Field(default_factory=dict)


def task_text(episode: Episode) -> str:
    """The farm task of a (maybe multi-turn) request: the first message, then the follow-ups."""
    return "\n\n".join(episode.messages)
