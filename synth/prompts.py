"""Prompt text of every stage. Each asks for one JSON object (or one python block) of a fixed shape."""

from __future__ import annotations

import json
from typing import Any

SYSTEM = (
    "You are a senior engineer synthesizing realistic, executable tool-use environments for training "
    "LLM agents: SQLite databases, FastAPI services and verifiers. Follow the requested output format "
    "exactly; never add commentary outside it."
)


def _msgs(user: str, system: str = SYSTEM) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# -- scenario -------------------------------------------------------------------------------------
def scenario_generate(examples: list[dict[str, str]], n: int, avoid: list[str]) -> list[dict[str, Any]]:
    shown = "\n".join(f"- {e['name']}: {e['description']}" for e in examples)
    taken = ", ".join(avoid[-60:]) or "none yet"
    return _msgs(
        "Task: SCENARIO GENERATION.\n"
        f"Here are example web applications:\n{shown}\n\n"
        f"Propose {n} NEW, different web applications in the same spirit. Each must manage its own data "
        "(users create, read, update and delete records), not only display content. "
        f"Do not repeat any of these already chosen: {taken}.\n"
        'Answer with JSON: {"scenarios": [{"name": "<product name>", "description": "<4-6 sentences: '
        'core entities, workflows, and what a signed-in user can change>", "category": "<short category, '
        'e.g. e_commerce, booking, project_management>"}]}'
    )


def scenario_classify(candidates: list[dict[str, str]]) -> list[dict[str, Any]]:
    listed = "\n".join(f"{i}. {c['name']}: {c['description']}" for i, c in enumerate(candidates))
    return _msgs(
        "Task: SCENARIO CLASSIFICATION.\n"
        "For each application decide whether it is suitable for a stateful CRUD environment: a signed-in "
        "user must be able to create, update and delete their own records through an API. Reject read-only "
        "or content-consumption sites (news, encyclopedias, search engines, static catalogs, streaming "
        "only).\n"
        f"{listed}\n\n"
        'Answer with JSON: {"results": [{"index": <int>, "crud_suitable": <bool>, "category": "<short '
        'category>", "reason": "<one sentence>"}]} with one entry per application.'
    )


# -- task -----------------------------------------------------------------------------------------
def task_messages(name: str, description: str, k: int) -> list[dict[str, Any]]:
    return _msgs(
        "Task: TASK GENERATION.\n"
        f"Application: {name}\nDescription: {description}\n\n"
        f"Write exactly {k} distinct tasks a signed-in user (user id 1, already authenticated) would ask "
        "an assistant to do in this application through its API. Each task must be solvable with API "
        "calls only, change or read concrete data, and carry concrete parameters (names, dates, amounts, "
        "titles in quotes). No login/signup steps, no UI clicks, no external services.\n"
        'Answer with JSON: {"tasks": ["...", ...]}'
    )


# -- db -------------------------------------------------------------------------------------------
def db_messages(name: str, description: str, tasks: list[str]) -> list[dict[str, Any]]:
    return _msgs(
        "Task: DATABASE SCHEMA.\n"
        f"Application: {name}\nDescription: {description}\nTasks the database must support:\n"
        + _numbered(tasks)
        + "\n\nDesign a normalized SQLite schema (include a users table; the signed-in user is id 1). "
        "Use INTEGER PRIMARY KEY ids, FOREIGN KEY clauses, NOT NULL/UNIQUE/CHECK where sensible, and "
        "DEFAULT CURRENT_TIMESTAMP for timestamps. One CREATE TABLE per table, indexes separately.\n"
        'Answer with JSON: {"tables": [{"name": "<table>", "ddl": "CREATE TABLE ...;", "indexes": '
        '["CREATE INDEX ...;"]}]}'
    )


# -- sample ---------------------------------------------------------------------------------------
def sample_messages(name: str, tasks: list[str], ddl: str) -> list[dict[str, Any]]:
    return _msgs(
        "Task: SAMPLE DATA.\n"
        f"Application: {name}\nSchema:\n{ddl}\n\nTasks that must be solvable on this data:\n"
        + _numbered(tasks)
        + "\n\nWrite realistic INSERT statements for every table so that every task can be carried out "
        "(every entity a task names must exist, with explicit ids). Respect foreign keys (parents first) "
        "and give a value for every listed column.\n"
        'Answer with JSON: {"tables": [{"table_name": "<table>", "reasoning": "<why these rows>", '
        '"insert_statements": ["INSERT INTO ...;"]}]}'
    )


# -- spec -----------------------------------------------------------------------------------------
def spec_messages(name: str, tasks: list[str], ddl: str) -> list[dict[str, Any]]:
    return _msgs(
        "Task: API SPECIFICATION.\n"
        f"Application: {name}\nSchema:\n{ddl}\n\nTasks:\n" + _numbered(tasks)
        + "\n\nDesign the REST toolset an agent needs to solve every task (the user is already signed in as "
        "user 1; no auth endpoints). Each endpoint: path, method, summary, description, a unique snake_case "
        "operation_id, tags, request_params ({param: {type, param_type: path|query|body, required, "
        "description, example}}), response (field -> {type, description}), required_tables, "
        "required_fields. Also say which operation ids solve each task.\n"
        'Answer with JSON: {"api_groups": [{"group_name": "...", "endpoints": [...]}], '
        '"task_coverage": {"0": ["operation_id", ...], ...}}'
    )


# -- env ------------------------------------------------------------------------------------------
def env_messages(name: str, ddl: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    return _msgs(
        "Task: ENVIRONMENT CODE.\n"
        f"Application: {name}\nSQLite schema (the database already exists with data):\n{ddl}\n\n"
        f"API spec:\n{json.dumps(spec, indent=1)}\n\n"
        "Write ONE self-contained Python module implementing every endpoint with FastAPI and SQLAlchemy "
        "2.x ORM: `engine = create_engine(os.getenv(\"DATABASE_PATH\", \"sqlite:///env.db\"), "
        "connect_args={\"check_same_thread\": False})`, `SessionLocal = sessionmaker(bind=engine)`, "
        "declarative models matching the schema exactly, `Base.metadata.create_all(engine)`, "
        "`app = FastAPI()`, one route per endpoint with `operation_id` equal to the spec's, pydantic "
        "request/response models, HTTPException(404/400) for missing or invalid input, and the signed-in "
        "user fixed to id 1. End with `if __name__ == \"__main__\": uvicorn.run(app)`.\n"
        "Answer with the module in one ```python block."
    )


# -- verifier -------------------------------------------------------------------------------------
def verifier_messages(name: str, task: str, ddl: str, sample: str, tools: str) -> list[dict[str, Any]]:
    return _msgs(
        "Task: VERIFIER.\n"
        f"Application: {name}\nTask: {task}\n\nSchema:\n{ddl}\n\nInitial data (excerpt):\n{sample}\n\n"
        f"Tools the agent has:\n{tools}\n\n"
        "Write two verifiers that compare the database before (initial_db_path) and after (final_db_path) "
        "an agent's episode, using only `sqlite3` (open read-only) and the standard library:\n"
        "1. sql mode: `def verify_task(initial_db_path: str, final_db_path: str) -> dict` returning the "
        "facts a judge needs (rows before/after), plus success and failure criteria in words.\n"
        "2. code mode: `def verify_task_completion(initial_db_path: str, final_db_path: str, final_answer: "
        "str | None = None) -> dict` returning {\"result\": \"complete\"} only when the task was done, "
        "else {\"result\": \"others\"}. It must say \"others\" when nothing changed, unless the task "
        "only asks for information: then final_answer (the agent's last message, None when it gave none) "
        "decides, checked against the data.\n"
        'Answer with JSON: {"reasoning": "...", "success_criteria": "...", "failure_criteria": "...", '
        '"sql_verifier": "<python code>", "code_verifier": "<python code>"}'
    )


def solution_messages(name: str, task: str, tools: str, sample: str) -> list[dict[str, Any]]:
    return _msgs(
        "Task: REFERENCE SOLUTION.\n"
        f"Application: {name}\nTask: {task}\n\nTools (JSON schemas of their flat arguments):\n{tools}\n\n"
        f"Initial data (excerpt):\n{sample}\n\n"
        "List the exact tool calls that solve the task on this data, in order, with literal arguments "
        "(use ids from the data). The signed-in user is id 1. When the task asks for information, also "
        "give the answer the user gets at the end (final_answer); otherwise final_answer is null.\n"
        'Answer with JSON: {"solution": [{"tool": "<name>", "arguments": {...}}], "final_answer": "<text or null>"}'
    )


# -- correction -----------------------------------------------------------------------------------
def summarize_messages(stage: str, errors: list[str], excerpt: str, extra: str = "") -> list[dict[str, Any]]:
    errs = "\n".join(f"- {e}" for e in errors[:20])
    return _msgs(
        f"Task: ERROR SUMMARY for the {stage} stage.\n"
        f"This generated {stage} output failed when executed.\nErrors:\n{errs}\n\n"
        f"Output (excerpt):\n{excerpt[:6000]}\n{extra}\n"
        "Explain the root cause, quote the problem code, and give concrete guidance for the fix.\n"
        + (GATE_TARGETS if stage == "gate" else "")
        + 'Answer with JSON: {"root_cause": "...", "problem_code": "...", "guidance": "..."'
        + (', "fix_target": "solution" | "verifier" | "data"' if stage == "gate" else "") + "}"
    )


# Kept free of the words the scripted test summaries key on.
GATE_TARGETS = (
    "Say where the fix belongs (fix_target): \"solution\" when the tool calls are wrong; \"verifier\" when "
    "the verifier judges a correct run wrongly; \"data\" when the task needs a row or entity that the "
    "initial database lacks (e.g. a call fails with 404 / not found because the record does not exist).\n"
)


def data_repair_messages(name: str, task: str, ddl: str, sample: str, failure: str) -> list[dict[str, Any]]:
    return _msgs(
        "Task: SAMPLE DATA REPAIR.\n"
        f"Application: {name}\nSchema:\n{ddl}\n\nInitial data (excerpt):\n{sample}\n\n"
        f"Task that must be solvable on this data: {task}\n\nWhy it is not:\n{failure}\n\n"
        "Write the ADDITIONAL INSERT statements the initial database needs so that the task can be carried "
        "out (every entity the task names must exist, with explicit ids that do not clash with existing "
        "rows). Only INSERTs, one statement each; do not change or repeat existing rows; respect foreign "
        "keys (parents first) and give a value for every listed column. Add as few rows as the task needs.\n"
        'Answer with JSON: {"tables": [{"table_name": "<table>", "reasoning": "<why these rows>", '
        '"insert_statements": ["INSERT INTO ...;"]}]}'
    )


def format_summary(summary: dict[str, Any]) -> str:
    return (
        f"Root cause: {summary.get('root_cause', '')}\n"
        f"Problem code: {summary.get('problem_code', '')}\n"
        f"Guidance: {summary.get('guidance', '')}"
    )


def retry_message(stage: str, attempt: int, feedback: str) -> str:
    return (
        f"Attempt {attempt} of the {stage} stage failed.\n{feedback}\n\n"
        "Fix these problems and answer again with the complete output in the same format."
    )


def _numbered(items: list[str]) -> str:
    return "\n".join(f"{i}. {t}" for i, t in enumerate(items))
