"""Read a catalog folder (AWM's JSONL files, unchanged) into typed EnvBundles.

A broken record or a missing piece becomes a problem on that env (or on the catalog), never an
exception that stops the rest from loading.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envfarm.errors import CatalogError, EnvNotFound
from envfarm.models import DBSchema, EnvBundle, SampleData, ToolCall, Verifier

BUNDLED_CATALOG = Path(__file__).parent

#: AWM file name -> what it holds. gen_solutions.jsonl (reference solutions), gen_probes.jsonl
#: (the hack probes' verdicts: ``envfarm envs check --hacks --write-flags``) and
#: gen_task_states.jsonl (a task's own starting database: ``drop_rows`` of the sample data) are
#: envfarm's extra files.
AWM_FILES = (
    "gen_scenario.jsonl", "gen_tasks.jsonl", "gen_db.jsonl", "gen_sample.jsonl", "gen_spec.jsonl",
    "gen_envs.jsonl", "gen_verifier.jsonl", "gen_verifier.pure_code.jsonl", "gen_solutions.jsonl",
    "gen_probes.jsonl", "gen_task_states.jsonl",
)


def normalize_name(name: str) -> str:
    """AWM's scenario-name normalization: lower case, runs of non [a-z0-9_] become '_'."""
    return re.sub(r"[^a-z0-9_]+", "_", name.strip().lower()).strip("_")


class Catalog:
    """Environment bundles by normalized name, plus problems that belong to no single env."""

    def __init__(self, bundles: dict[str, EnvBundle], problems: list[str], root: Path) -> None:
        self.bundles = bundles
        self.problems = problems
        self.root = root

    @property
    def names(self) -> list[str]:
        return sorted(self.bundles)

    @property
    def servable(self) -> list[str]:
        return [n for n in self.names if self.bundles[n].servable]

    def __getitem__(self, name: str) -> EnvBundle:
        key = normalize_name(name)
        if key not in self.bundles:
            raise EnvNotFound(f"no environment {name!r} in catalog {self.root}; "
                              f"known: {', '.join(self.names) or 'none'}", env=name)
        return self.bundles[key]

    def __contains__(self, name: str) -> bool:
        return normalize_name(name) in self.bundles

    def __len__(self) -> int:
        return len(self.bundles)


def load_catalog(path: str | Path | None = None, *, check_code: bool = True,
                 only: set[str] | None = None) -> Catalog:
    """Load a folder of AWM JSONL files, or a folder whose subfolders each hold such files.

    ``None`` loads the catalog bundled with envfarm. ``check_code=False`` skips compiling every
    env's and verifier's code for its syntax problems (~90 % of the time at 1,000 types): a
    farm compiles an env's code where it runs it, at load, and reports the failure there.
    ``only``: keep just these (normalized) env names (every file is still read).
    """
    root = Path(path) if path is not None else BUNDLED_CATALOG
    if not root.is_dir():
        raise CatalogError(f"catalog folder {root} does not exist", path=str(root))
    folders = [root] + sorted(p for p in root.iterdir() if p.is_dir() and _has_awm_files(p))
    folders = [f for f in folders if _has_awm_files(f)]
    if not folders:
        raise CatalogError(f"{root} holds no AWM files (expected some of: {', '.join(AWM_FILES)})",
                           path=str(root))
    builder = _Builder(check_code, only)
    for folder in folders:
        builder.read_folder(folder)
    return Catalog(builder.finish(), builder.catalog_problems, root)


def catalog_fingerprint(root: str | Path) -> tuple:
    """What changes when a catalog folder's AWM files change on disk: each file's path,
    size and modification time (stat calls only; nothing is read)."""
    root = Path(root)
    if not root.is_dir():
        return ()
    out = []
    for folder in [root] + sorted(p for p in root.iterdir() if p.is_dir()):
        for name in AWM_FILES:
            try:
                st = (folder / name).stat()
            except OSError:
                continue
            out.append((str(folder / name), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _has_awm_files(folder: Path) -> bool:
    return any((folder / name).is_file() for name in AWM_FILES)


class _Builder:
    def __init__(self, check_code: bool = True, only: set[str] | None = None) -> None:
        self.check_code = check_code
        self.only = only
        self.envs: dict[str, dict[str, Any]] = {}
        self.catalog_problems: list[str] = []

    def env(self, scenario: str) -> dict[str, Any]:
        name = normalize_name(scenario)
        return self.envs.setdefault(name, {"name": name, "problems": []})

    def read_folder(self, folder: Path) -> None:
        for file_name in AWM_FILES:
            for where, record in _records(folder / file_name, self.catalog_problems):
                scenario = record.get("scenario", record.get("name"))
                if not isinstance(scenario, str) or not scenario.strip():
                    self.catalog_problems.append(f"{where}: record without a scenario name")
                    continue
                if self.only is not None and normalize_name(scenario) not in self.only:
                    continue
                env = self.env(scenario)
                try:
                    self.absorb(file_name, record, env)
                except (ValidationError, KeyError, TypeError, ValueError) as exc:
                    env["problems"].append(f"{where}: malformed record: {_short(exc)}")

    def absorb(self, file_name: str, rec: dict[str, Any], env: dict[str, Any]) -> None:
        if file_name == "gen_scenario.jsonl":
            env["description"] = str(rec.get("description", ""))
        elif file_name == "gen_tasks.jsonl":
            env["tasks"] = [str(t) for t in rec["tasks"]]
        elif file_name == "gen_db.jsonl":
            env["db_schema"] = DBSchema.model_validate(rec["db_schema"])
        elif file_name == "gen_sample.jsonl":
            env["sample_data"] = SampleData.model_validate(rec["sample_data"])
        elif file_name == "gen_spec.jsonl":
            env["api_spec"] = dict(rec["api_spec"])
        elif file_name == "gen_envs.jsonl":
            env["code"] = str(rec["full_code"])
        elif file_name in ("gen_verifier.jsonl", "gen_verifier.pure_code.jsonl"):
            ver = rec["verification"]
            v = Verifier(task_idx=int(rec["task_idx"]), task=str(rec.get("task", "")),
                         code=str(ver["code"]), raw_response=str(ver.get("raw_response") or ""))
            mode = "sql" if file_name == "gen_verifier.jsonl" else "code"
            problem = _syntax_problem(v.code) if self.check_code else None
            if problem:
                env["problems"].append(f"{mode} verifier of task {v.task_idx}: {problem}")
            env.setdefault("verifiers" if mode == "sql" else "code_verifiers", {})[v.task_idx] = v
        elif file_name == "gen_solutions.jsonl":
            calls = [ToolCall.model_validate(c) for c in rec["solution"]]
            env.setdefault("solutions", {})[int(rec["task_idx"])] = calls
            if rec.get("final_answer") is not None:
                env.setdefault("solution_answers", {})[int(rec["task_idx"])] = str(rec["final_answer"])
        elif file_name == "gen_task_states.jsonl":
            drop = {str(t): [int(r) for r in rows] for t, rows in dict(rec["drop_rows"]).items()}
            env.setdefault("task_states", {})[int(rec["task_idx"])] = drop
        elif file_name == "gen_probes.jsonl":
            if rec.get("hacked") or rec.get("undecided"):
                idx, why = int(rec["task_idx"]), str(rec.get("summary") or "a hack probe passes its verifier")
                flagged = env.setdefault("flagged", {})
                flagged[idx] = f"{flagged[idx]}; {why}" if idx in flagged else why
                if rec.get("verifier_sha256"):
                    env.setdefault("_probed", {})[idx] = str(rec["verifier_sha256"])

    def finish(self) -> dict[str, EnvBundle]:
        out = {}
        for name, fields in self.envs.items():
            probed = fields.pop("_probed", {})
            bundle = EnvBundle(**fields)
            for idx, sha in probed.items():  # a flag on a verifier since replaced says nothing
                if sha != verifier_sha256(bundle, idx):
                    bundle.flagged.pop(idx, None)
                    bundle.problems.append(f"gen_probes.jsonl: task {idx}'s verifier changed since it "
                                           "was probed; its flag is dropped (envfarm envs check --hacks)")
            bundle.problems.extend(_completeness_problems(bundle, self.check_code))
            out[name] = bundle
        return out


def verifier_sha256(bundle: EnvBundle, idx: int) -> str:
    """What a probe record was taken against: the task's code- and sql-mode verifier source."""
    code, sql = bundle.code_verifiers.get(idx), bundle.verifiers.get(idx)
    text = f"{code.code if code else ''}\0{sql.code if sql else ''}"
    return hashlib.sha256(text.encode()).hexdigest()


def _records(path: Path, problems: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path.name}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"{where}: not JSON ({exc.msg})")
                continue
            if not isinstance(record, dict):
                problems.append(f"{where}: not a JSON object")
                continue
            yield where, record


def _syntax_problem(code: str) -> str | None:
    try:
        compile(code, "<verifier>", "exec")
    except SyntaxError as exc:
        return f"syntax error at line {exc.lineno}: {exc.msg}"
    return None


def _completeness_problems(b: EnvBundle, check_code: bool) -> list[str]:
    out = []
    if b.code is None:
        out.append("no env code (gen_envs.jsonl): cannot be served")
    elif check_code:
        problem = _syntax_problem(b.code)
        if problem:
            out.append(f"env code: {problem}")
    if b.code is not None and b.db_schema is None:
        out.append("env code but no schema (gen_db.jsonl): tables come only from the code's ORM")
    if b.sample_data is None:
        out.append("no sample data (gen_sample.jsonl): the initial database is empty")
    if not b.tasks:
        out.append("no tasks (gen_tasks.jsonl)")
    missing = [i for i in range(len(b.tasks)) if i not in b.code_verifiers]
    if b.tasks and missing:
        out.append(f"no code-mode verifier for task(s) {_ranges(missing)}")
    return out


def _ranges(idx: list[int]) -> str:
    return ",".join(map(str, idx)) if len(idx) < 4 else f"{idx[0]}..{idx[-1]}"


def _short(exc: Exception) -> str:
    text = str(exc).replace("\n", " ")
    return text[:300]
