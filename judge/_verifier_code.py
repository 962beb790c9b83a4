"""Reading verifier code without running it: which function to call, and in which mode.

AWM has two verifier flavours. sql mode: ``verify_task(initial_db_path, final_db_path) -> dict``
whose output an LLM judges against success/failure criteria. code mode:
``verify_task_completion(initial_db_path, final_db_path, final_answer=None) -> {"result": ...}``
that decides by itself. Anything else is whatever function AWM's ``raw_response`` names.
"""

from __future__ import annotations

import ast
import threading
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from envfarm.models import parse_raw_response

Mode = Literal["code", "sql"]

# CPython 3.11's ast module is not safe to use from several threads at once (gh-106905).
_AST_LOCK = threading.Lock()

CODE_FUNCTION = "verify_task_completion"
SQL_FUNCTION = "verify_task"


class VerifierSpec(BaseModel):
    """What a piece of verifier code is, as far as can be told without running it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode = Field(description="'code' decides by itself; 'sql' returns facts for a judge")
    function: str = Field(description="name of the function to call")
    takes_answer: bool = Field(default=True, description="the function accepts final_answer")
    syntax_error: str | None = Field(default=None, description="why the code does not parse")


def detect(code: str, mode: Mode | None = None, function: str | None = None,
           raw_response: str | None = None) -> VerifierSpec:
    """Pick the function and mode the way AWM does; never executes the code."""
    return _detect(code, mode, function, parse_raw_response(raw_response).function_name)


@lru_cache(maxsize=512)
def _detect(code: str, mode: Mode | None, function: str | None,
            raw_name: str | None) -> VerifierSpec:
    try:
        with _AST_LOCK:
            tree = ast.parse(code)
    except SyntaxError as exc:
        guess = function or (CODE_FUNCTION if CODE_FUNCTION in code else SQL_FUNCTION)
        guessed_mode = mode or ("code" if guess == CODE_FUNCTION else "sql")
        where = f" (line {exc.lineno})" if exc.lineno else ""
        return VerifierSpec(mode=guessed_mode, function=guess,
                            syntax_error=f"syntax error{where}: {exc.msg}")
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if function is None:
        if mode == "code" and CODE_FUNCTION in defs:
            function = CODE_FUNCTION
        elif mode == "sql" and SQL_FUNCTION in defs:
            function = SQL_FUNCTION
        elif CODE_FUNCTION in defs:
            function = CODE_FUNCTION
        elif SQL_FUNCTION in defs:
            function = SQL_FUNCTION
        elif raw_name:
            function = raw_name
        elif len(defs) == 1:
            function = next(iter(defs))
        else:
            function = SQL_FUNCTION if mode != "code" else CODE_FUNCTION
    node = defs.get(function)
    takes_answer = node is not None and (
        len(node.args.posonlyargs) + len(node.args.args) >= 3 or node.args.vararg is not None
    )
    if mode is None:
        mode = "code" if function == CODE_FUNCTION or takes_answer else "sql"
    return VerifierSpec(mode=mode, function=function, takes_answer=takes_answer)
