"""How the scripted user words a step, and how the honest scripted agent reads it back.

A step is said without the tool's name: the action verb in a user's words ("get rid of" for
delete), the thing it is about, each record it acts on by its name ("for the book 'Dune'") or as
the one an earlier step made ("for the loan from before"), and the values the user states
("with borrower name 'Ann'"). A record the user has no name for (its id is all the chain knew) is
left unsaid: the request is then ambiguous, as a real one would be.

The reader (``HonestReader``) sees only the request and what its own calls return: it maps the
words back to a tool of the listing, finds each named record by reading (a list tool of that
thing, then the one record whose fields hold the name) and fails, saying why, when a thing is
not named and not the only one, when a name fits several records, or when a question's answer
has several values.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

#: a user's words for an action verb (the reader inverts this); other verbs: "do a <verb> on"
SAY = {"list": "show me", "get": "look up", "search": "find", "create": "set up", "add": "put in",
       "delete": "get rid of", "remove": "take off", "update": "change", "cancel": "call off",
       "lend": "hand out", "return": "bring back", "set": "make", "mark": "flag", "send": "send off",
       "check": "check on", "close": "close out", "change": "move", "validate": "verify",
       "apply": "use", "ping": "see about"}
_VERB = {v: k for k, v in SAY.items()}
_STEP = re.compile(r"^(?P<say>.+?) the (?P<nouns>[a-z ]+?)(?P<rest>(?: for the .*| with .*)?)$")
_REF = re.compile(r" for the (?P<entity>[a-z ]+?) (?:'(?P<name>[^']*)'|(?P<before>from before))")
_VALUE = re.compile(r"(?P<param>[a-z ]+?) '(?P<value>[^']*)'")
_ASK = re.compile(r", and tell me the (?P<field>[a-z0-9 ]+)\?$")


def words(name: str) -> str:
    return name.replace("_", " ").strip()


def snake(text: str) -> str:
    return "_".join(text.split())


def id_param(name: str) -> bool:
    return re.search(r"(^|_)id$", name.lower()) is not None


def say_step(tool: str, refs: list[tuple[str, str | None]], values: list[tuple[str, Any]]) -> str:
    """One step in a user's words: refs are (id parameter, the record's name or None: "the one
    an earlier step made"); values are (parameter, value) the user states."""
    verb, _, nouns = tool.partition("_")
    said = f"{SAY[verb]} the {words(nouns) or 'service'}" if verb in SAY else f"do a {verb} on the {words(nouns)}"
    for param, name in refs:
        entity = words(param[:-3]) or "item"
        said += f" for the {entity} '{name}'" if name is not None else f" for the {entity} from before"
    if values:
        said += " with " + " and ".join(f"{words(p)} '{v}'" for p, v in values)
    return said


def steps_of(task: str) -> tuple[list[str], str | None]:
    """The step phrases of a written request (every turn's), and the field a question asks for."""
    asked = None
    phrases: list[str] = []
    for message in task.split("\n\n"):
        ask = _ASK.search(message)
        if ask:
            asked, message = snake(ask.group("field")), message[:ask.start()] + "?"
        body = message.removeprefix("Could you ").removesuffix(" for me?").removesuffix("?")
        phrases += [p for p in body.split(", then ") if p]
    return phrases, asked


@dataclass
class Step:
    tool: str
    refs: list[tuple[str, str | None]]    # (entity words, name or None: "from before")
    values: dict[str, str]                # parameter -> stated value


def parse_step(phrase: str, tools: dict[str, dict[str, Any]]) -> Step | None:
    m = _STEP.match(phrase)
    if m is None:
        return None
    say, nouns = m.group("say"), snake(m.group("nouns"))
    verb = say[len("do a "):-len(" on")] if say.startswith("do a ") else _VERB.get(say)
    tool = next((t for t in (f"{verb}_{nouns}", verb) if t in tools), None) if verb else None
    if tool is None:
        return None
    rest = m.group("rest")
    refs = [(r.group("entity"), r.group("name")) for r in _REF.finditer(rest)]
    values = {}
    if " with " in rest or rest.startswith(" with "):
        for v in _VALUE.finditer(rest.split(" with ", 1)[1]):
            values[snake(v.group("param").strip().removeprefix("and "))] = v.group("value")
    return Step(tool, refs, values)


def records(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value] + [r for v in value.values() for r in records(v)]
    return [r for v in value for r in records(v)] if isinstance(value, list) else []


def typed(value: str, schema: dict[str, Any]) -> Any:
    kinds = {schema.get("type")} | {a.get("type") for a in schema.get("anyOf", [])}
    for kind, cast in (("integer", int), ("number", float)):
        if kind in kinds:
            try:
                return cast(value)
            except ValueError:
                pass
    if "boolean" in kinds and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


class Stuck(Exception):
    """The request does not say enough to go on (the agent's final answer says why)."""


@dataclass
class HonestReader:
    """Decides the next call from the request, the tool listing and its calls' results so far."""

    task: str
    tools: dict[str, dict[str, Any]]                                   # name -> input schema
    history: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)  # the farm's answers
    _cursor: int = 0

    def next_action(self) -> tuple[str, dict[str, Any]] | str:
        """(tool, arguments) to call next, or the final answer."""
        self._cursor = 0
        phrases, asked = steps_of(self.task)
        try:
            if not phrases:
                raise Stuck("I could not tell what you want.")
            for phrase in phrases:
                step = parse_step(phrase, self.tools)
                if step is None:
                    raise Stuck("I could not tell what you want.")
                args = self._arguments(step)
                self._do(step.tool, args)
            return self._answer(asked)
        except _Call as call:
            return call.tool, call.arguments
        except Stuck as stuck:
            return str(stuck)

    def _do(self, tool: str, args: dict[str, Any]) -> Any:
        """The result of this call, made earlier in the episode; raises _Call to make it now."""
        if self._cursor >= len(self.history):
            raise _Call(tool, args)
        done_tool, done_args, answer = self.history[self._cursor]
        if (done_tool, done_args) != (tool, args):
            raise Stuck("I lost track of what I was doing.")
        self._cursor += 1
        if not answer.get("ok"):
            raise Stuck(f"{words(tool)} did not work: {answer.get('error', {}).get('message', '')}"[:300])
        return answer.get("result")

    def _arguments(self, step: Step) -> dict[str, Any]:
        schema = self.tools[step.tool]
        props, required = schema.get("properties", {}), set(schema.get("required", []))
        args = {p: typed(v, props.get(p, {})) for p, v in step.values.items() if p in props}
        refs = {snake(e): name for e, name in step.refs}
        for param in props:
            if param in args or not id_param(param):
                continue
            entity = param[:-3]
            if entity in refs:
                args[param] = self._resolve(param, refs[entity])
            elif param in required:
                args[param] = self._only_one(param)
        missing = required - set(args)
        if missing:
            raise Stuck(f"I need your {', '.join(words(m) for m in sorted(missing))} to do that.")
        return args

    def _resolve(self, param: str, name: str | None) -> Any:
        if name is None:  # "from before": what the latest of my calls that returned one said
            for _, _, answer in reversed(self.history[:self._cursor]):
                hits = {json.dumps(r[param]) for r in records(answer.get("result")) if param in r}
                if hits:
                    if len(hits) == 1:
                        return json.loads(hits.pop())
                    break
            raise Stuck(f"Which {words(param[:-3])} do you mean?")
        hits = [r for r in self._listing(param) if any(str(v).lower() == name.lower() for v in r.values())]
        if len(hits) != 1:
            raise Stuck(f"I found {len(hits)} {words(param[:-3])}s called {name!r}: which one?")
        return hits[0].get(param, hits[0].get("id"))

    def _only_one(self, param: str) -> Any:
        found = {r.get(param, r.get("id")) for r in self._listing(param)} - {None}
        if len(found) != 1:
            raise Stuck(f"Which {words(param[:-3])} do you mean? I see {len(found)}.")
        return found.pop()

    def _listing(self, param: str) -> list[dict[str, Any]]:
        """The records of a list tool of the thing ``param`` points to (called, or found made)."""
        entity = param[:-3]
        plural = entity[:-1] + "ies" if entity.endswith("y") else entity + "s"
        for name, schema in sorted(self.tools.items()):
            if name.startswith(("list_", "search_")) and name.endswith(plural) and not schema.get("required"):
                return [r for r in records(self._do(name, {})) if "id" in r or param in r]
        raise Stuck(f"I cannot find your {words(entity)}s.")

    def _answer(self, asked: str | None) -> str:
        if asked is None:
            return "Done, as you asked."
        if not self.history:
            raise Stuck("I could not find it.")
        values = {json.dumps(r[asked]) for r in records(self.history[self._cursor - 1][2].get("result"))
                  if asked in r}
        if len(values) != 1:
            raise Stuck(f"There are {len(values)} {words(asked)}s there: which one do you mean?")
        return f"The {words(asked)} is {json.loads(values.pop())}."


class _Call(Exception):
    """The reader's next call (raised from where the plan needs its answer)."""

    def __init__(self, tool: str, arguments: dict[str, Any]) -> None:
        super().__init__(tool)
        self.tool, self.arguments = tool, arguments
