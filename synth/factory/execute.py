"""Running a sampled chain with concrete arguments on a fresh instance, and what it changed.

Values are deterministic under a seed: a ``db`` binding picks one of the column's values, a
``step`` binding one of the values the earlier call returned at that field, a ``task`` binding a
value of a same-named column of the initial database (what a user would say: a name, a city),
else the schema's example. With ``consistent`` (the default) every value is drawn from rows that
agree with the rows the chain already used and with the acting user (``synth.factory.consistent``),
and a step the env refuses is drawn again with other values (``step_tries``). A chain is kept only
when every call succeeds and it did something: the final database differs from the initial one, or
the last call returned data, and no step meant to write (not a GET) left the database as it was.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from envfarm.check import example_arguments
from envfarm.dbrows import table_rows
from envfarm.runtime import EnvRuntime
from synth.factory.consistent import Draw, relations
from synth.factory.dbvalues import (
    DbColumns,
    column_values,
    db_source,
    strict_id,
)
from synth.factory.fields import field_values
from synth.factory.model import Call, Chain

#: Why a chain is dropped before any LLM call (keys of the report's drop counts).
DROP_UNKNOWN_TOOL = "unknown_tool"
DROP_NO_VALUE = "no_value"          # a binding had no concrete value (empty column or field)
DROP_CALL_FAILED = "call_failed"
DROP_NO_EFFECT = "no_effect"        # nothing changed and the last call returned nothing
DROP_IDLE_WRITE = "idle_write"      # a step meant to change something changed nothing

#: calls per step: the first draw, then other values when the call fails or writes nothing
STEP_TRIES = 4


@dataclass
class Executed:
    chain: Chain
    calls: list[Call] = field(default_factory=list)
    final: bytes = b""
    changed: bool = False
    #: parameter -> value the user states (``task`` bindings), for the query prompt
    stated: dict[str, Any] = field(default_factory=dict)
    drop: str = ""                  # "" when the chain is kept
    detail: str = ""
    #: values drawn from any row because none agreed with the chain's rows (consistent draws only)
    unpinned: int = 0
    #: (step, parameter, value) drawn among several for the call that failed: a later draw avoids them
    failed_values: set[tuple[int, str, str]] = field(default_factory=set)


async def execute_chain(runtime: EnvRuntime, chain: Chain, columns: DbColumns, seed: int | str = 0, *,
                        optional: bool = False, consistent: bool = True, step_tries: int = STEP_TRIES,
                        avoid: frozenset[tuple[int, str, str]] = frozenset(),
                        initial: bytes | None = None) -> Executed:
    """Run ``chain`` on a fresh instance of ``runtime``; never raises for a bad chain.

    ``optional``: also pass each optional parameter a same-named database column can fill (a
    value the user states), for tools that refuse a call without one ("provide at least one of").
    ``consistent=False``: every value drawn on its own (the earlier draw, for comparison).
    ``step_tries``: a step whose call fails, or writes nothing, is drawn again with values it has
    not tried (a cancelled reservation cannot be cancelled, another one of the user's can), up to
    this many calls; a failed call changes nothing, so only the accepted call is recorded.
    ``avoid``: (step, parameter, repr(value)) an earlier run failed with, not drawn again while
    another value is left. ``initial``: the scenario's own starting database (``synth.factory.
    scenario``; values are drawn from it); None: the env's sample data.
    """
    rng = random.Random(f"{seed}:{chain.chain_id}")
    tools = {t.name: t for t in runtime.tools}
    out = Executed(chain=chain)
    data = runtime.template.data if initial is None else initial
    draw = Draw(relations(data, runtime.bundle.code)) if consistent else None
    inst = runtime.instance(initial)
    try:
        for i, step in enumerate(chain.steps):
            tool = tools.get(step.tool)
            if tool is None:
                out.drop, out.detail = DROP_UNKNOWN_TOOL, f"step {i}: the env has no tool {step.tool}"
                return out
            tried, relaxed = set(avoid), False
            writing = writes(runtime, step.tool)
            for attempt in range(max(1, step_tries)):
                pins = dict(draw.pins) if draw else {}
                drawn = _draw_args(out, i, step, tool, columns, data, rng, None if relaxed else draw, tried,
                                   optional, writing)
                if drawn is None:
                    return out
                args, picked, stated = drawn
                before = inst.snapshot()
                res = await inst.call(step.tool, args)
                call = Call(tool=step.tool, arguments=args, ok=res.ok, changed=inst.snapshot() != before,
                            result=res.result if res.ok else res.error.model_dump())
                idle = res.ok and not call.changed and writing
                fresh = picked - tried
                if (res.ok and not idle) or attempt == step_tries - 1 or not (fresh or (draw and not relaxed)):
                    break
                # another value for what was drawn among several; with none left, any row's values
                # (the pinned user's own id is not the member a tool may remove)
                relaxed = relaxed or not fresh
                tried |= fresh
                if draw:
                    draw.pins = pins
            out.calls.append(call)
            out.stated.update(stated)
            if not res.ok:
                out.failed_values = picked
                out.drop = DROP_CALL_FAILED
                out.detail = f"step {i} {step.tool}: {res.error.message}"[:300]
                return out
        out.final = inst.snapshot()
    finally:
        inst.close()
        out.unpinned = draw.unpinned if draw else 0
    out.changed = out.final != data
    if not out.changed and not has_data(out.calls[-1].result):
        out.drop, out.detail = DROP_NO_EFFECT, "the database is unchanged and the last call returned nothing"
    idle = [f"step {i} {c.tool}" for i, c in enumerate(out.calls)
            if not c.changed and writes(runtime, c.tool)]
    if idle and not out.drop:
        # "unlike" on a video not liked: the request asks for a change a no-op already has
        out.drop, out.detail = DROP_IDLE_WRITE, f"{', '.join(idle)} changed nothing"
    return out


def _draw_args(out: Executed, i: int, step: Any, tool: Any, columns: DbColumns, data: bytes, rng: random.Random,
               draw: Draw | None, avoid: set[tuple[int, str, str]], optional: bool, writing: bool
               ) -> tuple[dict[str, Any], set[tuple[int, str, str]], dict[str, Any]] | None:
    """Step ``i``'s arguments, the (step, parameter, value) drawn among several, and the values the
    user states; None (``out.drop`` set) when a binding has no value. A value the user states to a
    writing tool (a new label's name) is any row's, not the pinned rows' (those exist already)."""
    args: dict[str, Any] = {}
    picked: set[tuple[int, str, str]] = set()
    stated: dict[str, Any] = {}
    props = tool.input_schema.get("properties", {})
    for name, b in step.bindings.items():
        where = (b.table or "", b.column or "") if b.kind == "db" else db_source(name, columns)
        if b.kind == "step":
            options = field_values(out.calls[b.step].result, b.field or "") if b.step is not None else []
            options = [v for v in options if v is not None and not isinstance(v, (dict, list))]
            options = draw.prefer(*where, options) if draw and where else options
        else:
            options = _column(None if writing and b.kind == "task" else draw, data, where)
            if b.kind == "task":
                options = options or [example_arguments(tool).get(name)]
        options = [v for v in options if v is not None and not isinstance(v, (dict, list))]
        if not options:
            out.drop, out.detail = DROP_NO_VALUE, f"step {i} {step.tool}: no value for {name}"
            return None
        fresh = [v for v in options if (i, name, repr(v)) not in avoid]
        value = rng.choice(fresh or options)
        if len(options) > 1:
            picked.add((i, name, repr(value)))
        if draw and where:
            draw.took(*where, value)
        args[name] = fit_schema(value, props.get(name))
        if b.kind == "task":
            stated[name] = args[name]
    if optional:
        for name, value in _optional_values(tool.input_schema, args, columns, data, rng, draw).items():
            args[name] = stated[name] = fit_schema(value, props.get(name))
    return args, picked, stated


#: Drops another draw of values may cure.
REDRAW = (DROP_CALL_FAILED, DROP_NO_VALUE, DROP_IDLE_WRITE)


@dataclass
class Drawn:
    """One execution of a chain and the arguments that reproduce it (``execute_chain(**kwargs)``)."""

    executed: Executed
    kwargs: dict[str, Any]


async def execute_drawing(runtime: EnvRuntime, chain: Chain, columns: DbColumns, seed: int | str = 0, *,
                          tries: int = 5, consistent: bool = True, avoid_failed: bool = True,
                          step_tries: int = STEP_TRIES, initial: bytes | None = None) -> list[Drawn]:
    """Every draw until one executes: ``tries`` value draws, then two with optional parameters filled
    (an update tool refuses a call that changes nothing); each avoids the values earlier failed
    calls were given (``avoid_failed``). The last entry is the outcome."""
    avoid: set[tuple[int, str, str]] = set()
    out: list[Drawn] = []
    for attempt, optional in [(a, False) for a in range(tries)] + [(tries + a, True) for a in range(2)]:
        kwargs = {"seed": f"{seed}.{attempt}", "optional": optional, "consistent": consistent,
                  "step_tries": step_tries, "avoid": frozenset(avoid), "initial": initial}
        ex = await execute_chain(runtime, chain, columns, **kwargs)
        out.append(Drawn(ex, kwargs))
        if ex.drop not in REDRAW:
            break
        if avoid_failed:
            avoid |= ex.failed_values
    return out


def writes(runtime: EnvRuntime, tool: str) -> bool:
    """The tool's HTTP method asks for a change (anything but GET/HEAD)."""
    op = runtime.operations.get(tool)
    return op is not None and op.method.upper() not in ("GET", "HEAD")


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    found = {schema["type"]} if isinstance(schema.get("type"), str) else set(schema.get("type") or [])
    for alt in schema.get("anyOf", []) + schema.get("oneOf", []):
        found |= _types(alt)
    return found


def fit_schema(value: Any, schema: Any) -> Any:
    """A database value as the parameter's JSON type: SQLite keeps booleans as 0/1 and numbers in
    text columns, which the env's FastAPI coerces but an agent held to the schema may not send."""
    types = _types(schema)
    if not types or isinstance(value, bool):
        return value
    if "boolean" in types and not types & {"integer", "number", "string"} and str(value).lower() in (
            "0", "1", "true", "false"):
        return str(value).lower() in ("1", "true")
    if isinstance(value, str) and not types & {"string"}:
        try:
            return int(value) if "integer" in types else float(value) if "number" in types else value
        except ValueError:
            return value
    if isinstance(value, (int, float)) and not types & {"integer", "number"} and "string" in types:
        return str(value)
    return value


def _column(draw: Draw | None, data: bytes, where: tuple[str, str] | None) -> list[Any]:
    """A column's values: those of rows agreeing with the chain's draw, or all of them."""
    if where is None:
        return []
    return draw.column(*where) if draw else column_values(data, *where)


def _optional_values(schema: dict[str, Any], args: dict[str, Any], columns: DbColumns, data: bytes,
                     rng: random.Random, draw: Draw | None = None) -> dict[str, Any]:
    required = set(schema.get("required", []))
    out = {}
    for name in schema.get("properties", {}):
        if name in required or name in args or strict_id(name):
            continue
        where = db_source(name, columns)
        values = [v for v in _column(draw, data, where) if v is not None and not isinstance(v, (dict, list))]
        if values:
            out[name] = rng.choice(values)
            if draw and where:
                draw.took(*where, out[name])
    return out


def has_data(value: Any) -> bool:
    """A non-empty answer: some scalar that is not None/""."""
    if isinstance(value, dict):
        return any(has_data(v) for v in value.values())
    if isinstance(value, list):
        return any(has_data(v) for v in value)
    return value is not None and value != ""


def diff_rows(initial: bytes, final: bytes) -> dict[str, dict[str, Any]]:
    """What changed per table: ``added`` rows, ``changed`` (rowid, old, new), ``deleted`` rowids."""
    before, after = table_rows(initial), table_rows(final)
    out: dict[str, dict[str, Any]] = {}
    for table in sorted(set(before) | set(after)):
        b, a = before.get(table, {}), after.get(table, {})
        added = [a[k] for k in sorted(set(a) - set(b))]
        deleted = sorted(set(b) - set(a))
        changed = [(k, b[k], a[k]) for k in sorted(set(a) & set(b)) if a[k] != b[k]]
        if added or deleted or changed:
            out[table] = {"added": added, "deleted": deleted, "changed": changed}
    return out
