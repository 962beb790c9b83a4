"""Scripting the mock OpenAI server with the recorded answers of tests/fakes/synth_fixtures/.

``script_pipeline(mock, broken=True)`` installs answers for every stage of the two fixture scenarios
("Shelfie" -> library_1, "Recipe Box" -> recipes_1). With ``broken=True`` the first answers are
broken at every executable stage (and one task stage answer is malformed JSON, one spec call gets
HTTP 429 then 500), so each self-correction loop must converge; the gate must drop library_1's
task 2 (no tool can sell a book) and repair recipes_1's task 2 verifier.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.fakes.mock_openai import MockOpenAI, Reply, SeenRequest
from tests.fakes.synth_fixtures import library, recipes

FIXTURES = {"library_1": library, "recipes_1": recipes}

NEWS = {"name": "Daily Herald", "category": "news",
        "description": "Daily Herald publishes news articles and opinion pieces that readers browse and read."}
NEAR_DUPLICATE = {"name": "ShelfShare", "category": "book_sharing",
                  "description": library.SCENARIO["description"].replace("Shelfie", "ShelfShare")}


def _j(obj: Any) -> str:
    return json.dumps(obj)


def _fenced(code: str) -> str:
    return f"Here is the module.\n\n```python\n{code}```\n"


def _verifier_answer(sql: str, code: str) -> str:
    return _j({"reasoning": "Compare the rows the task changes before and after the episode.",
               "success_criteria": "The row the task asks for exists in its final state only after the episode.",
               "failure_criteria": "The database is unchanged or changed differently.",
               "sql_verifier": sql, "code_verifier": code})


def _classify(req: SeenRequest) -> str:
    results = []
    for m in re.finditer(r"^(\d+)\. ([^:\n]+):", req.last_user, re.M):
        idx, name = int(m.group(1)), m.group(2).strip()
        if name == NEWS["name"]:
            results.append({"index": idx, "crud_suitable": False, "category": "news", "reason": "read-only content"})
        else:
            cat = {"Shelfie": "library", "Recipe Box": "recipes", "ShelfShare": "book_sharing"}.get(name, "other")
            results.append({"index": idx, "crud_suitable": True, "category": cat, "reason": "users manage their data"})
    return _j({"results": results})


def _summary(req: SeenRequest) -> str:
    target = "verifier" if "no-op" in req.last_user else "solution"
    return _j({"root_cause": "The generated output does not run as required (see errors).",
               "problem_code": req.last_user.split("Errors:", 1)[-1][:200],
               "guidance": "Fix exactly the failing statement or call and keep everything else.",
               "fix_target": target})


def script_pipeline(mock: MockOpenAI, *, broken: bool = True) -> None:
    """Install every stage's answers for both scenarios (good answers repeat forever)."""
    mock.script(_j({"scenarios": [library.SCENARIO, NEWS, NEAR_DUPLICATE, recipes.SCENARIO]}), stage="scenario", repeat=True)
    mock.script(_classify, stage="scenario.classify", repeat=True)
    for stage in ("db", "sample", "env", "verifier", "gate"):
        mock.script(_summary, stage=f"{stage}.fix", repeat=True)
    if broken:
        mock.script('{"tasks": ["Lend my copy of', stage="task", scenario="library_1")  # malformed JSON
        mock.script(_j({"tables": library.TABLES_BROKEN}), stage="db", scenario="library_1")
        mock.script(_j({"tables": recipes.SAMPLE_BROKEN}), stage="sample", scenario="recipes_1")
        mock.script(Reply.error(429), Reply.error(500), stage="spec", scenario="recipes_1")
        mock.script(_fenced(library.ENV_IMPORT_ERROR), _fenced(library.ENV_HANDLER_500), stage="env", scenario="library_1")
        mock.script(_verifier_answer(recipes.VERIFIERS[1]["sql"], recipes.VERIFIER_RAISES), stage="verifier",
                    scenario="recipes_1", match=lambda r: recipes.TASKS[1] in r.prompt)
        mock.script(_verifier_answer(recipes.VERIFIERS[2]["sql"], recipes.VERIFIER_NOT_DISCRIMINATING), stage="verifier",
                    scenario="recipes_1", match=lambda r: recipes.TASKS[2] in r.prompt)
    for name, fx in FIXTURES.items():
        mock.script(_j({"tasks": fx.TASKS}), stage="task", scenario=name, repeat=True)
        mock.script(_j({"tables": fx.TABLES}), stage="db", scenario=name, repeat=True)
        mock.script(_j({"tables": fx.SAMPLE}), stage="sample", scenario=name, repeat=True)
        mock.script(_j(fx.SPEC), stage="spec", scenario=name, repeat=True)
        mock.script(_fenced(fx.ENV_CODE), stage="env", scenario=name, repeat=True)
        for idx, task in enumerate(fx.TASKS):
            v = fx.VERIFIERS[idx]
            mock.script(_verifier_answer(v["sql"], v["code"]), stage="verifier", scenario=name, repeat=True,
                        match=lambda r, t=task: t in r.prompt)
            mock.script(_j({"solution": fx.SOLUTIONS[idx]}), stage="gate", scenario=name, repeat=True,
                        match=lambda r, t=task: f"Task: {t}" in r.prompt)


def write_seeds(path: Any) -> None:
    """A small seed file (AWM's format)."""
    seeds = [
        {"name": "Goodreads", "description": "Goodreads lets readers track books they read, rate and review them, and build shelves."},
        {"name": "Allrecipes", "description": "Allrecipes hosts recipes that home cooks save, rate, and organize into collections."},
        {"name": "Trello", "description": "Trello organizes projects into boards, lists and cards that teams create and move."},
    ]
    path.write_text("".join(json.dumps(s) + "\n" for s in seeds))
