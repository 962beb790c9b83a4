"""The packages are layered one way, read from the source (every import, lazy ones included):

    contracts < runtime < farm | client < judge < synth < compose/serve < trainer < cli

A module imports only from its own layer group or the ones below; the farm and the client (one
layer, two groups) know nothing of each other; a private module (``x._y``) is imported only from
inside the package ``x``; nothing imports the command line. The SDK's weight is checked by
importing it with the server side blocked.

The top-level folders are layered too (``FOLDERS``, bottom first): no import runs up a folder,
so the folders have no cycle; the test suite and the benchmarks share only ``tests/fakes``.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envfarm", "judge", "synth", "trainer")

#: (group, rank, module prefixes); the longest matching prefix places a module.
LAYERS: list[tuple[str, int, tuple[str, ...]]] = [
    ("contracts", 0, ("envfarm.errors", "envfarm.models", "envfarm.wire", "envfarm.verdict")),
    ("runtime", 1, ("envfarm", "envfarm.catalog", "envfarm.llm", "envfarm.check")),
    ("farm", 2, ("envfarm.farm",)),
    ("client", 2, ("envfarm.client",)),
    ("judge", 3, ("judge",)),
    ("synth", 4, ("synth",)),
    ("compose", 5, ("envfarm.compose", "envfarm.serve")),
    ("trainer", 6, ("trainer",)),
    ("cli", 7, ("envfarm.cli", "envfarm.cli_envs", "envfarm.cli_farm", "envfarm.cli_hacks")),
]


def place(module: str) -> tuple[str, int]:
    best: tuple[int, str, int] | None = None
    for group, rank, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                    best is None or len(prefix) > best[0]):
                best = (len(prefix), group, rank)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[1], best[2]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute first-party import in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: use absolute imports"
            out.append((node.lineno, node.module or "", [a.name for a in node.names]))
    return [(line, mod, names) for line, mod, names in out if mod.split(".")[0] in PACKAGES]


def private_owner(target: str, names: list[str]) -> str | None:
    """The package a private import reaches into (``a.b`` for ``a.b._c`` or ``from a.b import
    _c``), or None when nothing private is imported."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_"):
            return ".".join(parts[:i])
    if any(n.startswith("_") for n in names):
        return target
    return None


def violations(module: str, imported: list[tuple[int, str, list[str]]]) -> list[str]:
    group, rank = place(module)
    found = []
    for line, target, names in imported:
        t_group, t_rank = place(target)
        if t_rank > rank or (t_rank == rank and t_group != group):
            found.append(f"{module}:{line} ({group}) imports {target} ({t_group})")
        owner = private_owner(target, names)
        if owner is not None and not (module == owner or module.startswith(owner + ".")):
            found.append(f"{module}:{line} reaches into private {target} {names or ''}")
    return found


def test_every_import_points_down():
    found = []
    for path in sources():
        found += violations(module_name(path), imports(path))
    assert not found, "imports against the layers:\n" + "\n".join(found)


@pytest.mark.parametrize(("module", "target", "names"), [
    ("envfarm.farm._core", "judge", ["Judge"]),            # the farm is handed its verifier
    ("judge.core", "synth.llm", ["LLMClient"]),             # upward
    ("envfarm.client._client", "envfarm.farm", ["Lease"]),  # sideways: the SDK is light
    ("synth.stages.env", "envfarm.cli", ["app"]),           # nothing imports the CLI
    ("envfarm.serve._build", "envfarm.farm._http", ["error_response"]),  # private
    ("trainer", "envfarm.farm", ["_core"]),                 # private, spelled the other way
])
def test_the_check_catches(module, target, names):
    assert violations(module, [(1, target, names)])


def test_the_check_allows_what_the_layers_allow():
    assert not violations("envfarm.serve._deployments", [(1, "envfarm._asgi", ["call_asgi"])])
    assert not violations("envfarm.compose", [(1, "judge", ["Judge"])])
    assert not violations("envfarm.cli", [(1, "synth.cli", ["app"])])
    assert not violations("envfarm.farm._core", [(1, "envfarm.farm._pool", ["InstancePool"])])


#: The top-level folders that hold Python, bottom first: a folder imports only from itself and
#: the folders before it. The benchmarks measure what the tests prove, so they sit above them.
FOLDERS = ("envfarm", "judge", "synth", "trainer", "cluster", "tests", "benchmarks")

#: Imports that run up a folder today, (module, folder it imports from): the composition root
#: (compose, the command line) still lives in envfarm/, the bottom folder. Issue 36 phase B
#: removes these; the list only shrinks (an entry no import needs any more fails the test).
KNOWN_UPWARD = {
    ("envfarm.cli", "judge"), ("envfarm.cli", "synth"), ("envfarm.cli", "trainer"),
    ("envfarm.cli_envs", "judge"), ("envfarm.compose", "judge"),
}


def folder_imports() -> dict[str, set[str]]:
    """module -> every first-party module it imports (relative imports resolved), over all the
    Python of the top-level folders."""
    out: dict[str, set[str]] = {}
    for path in sorted(p for top in FOLDERS for p in (REPO / top).rglob("*.py")):
        module = module_name(path)
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        found = out.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                found.add(".".join(base + ([node.module] if node.module else [])))
        out[module] = {m for m in found if m.split(".")[0] in FOLDERS}
    return out


def folder_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports up a folder (beyond ``KNOWN_UPWARD``), imports between tests and benchmarks other
    than through ``tests.fakes``, and entries of ``KNOWN_UPWARD`` nothing needs any more."""
    found, used = [], set()
    for module, targets in graph.items():
        top = module.split(".")[0]
        for target in sorted(targets):
            to = target.split(".")[0]
            fake = target == "tests.fakes" or target.startswith("tests.fakes.")
            if FOLDERS.index(to) > FOLDERS.index(top):
                if (module, to) in KNOWN_UPWARD:
                    used.add((module, to))
                else:
                    found.append(f"{module} ({top}) imports {target} ({to}): up a folder")
            elif top == "benchmarks" and to == "tests" and not fake:
                found.append(f"{module} imports {target}: benchmarks share only tests.fakes")
            elif module.startswith("tests.fakes") and to == "tests" and not fake:
                found.append(f"{module} imports {target}: tests.fakes stands alone")
    found += [f"KNOWN_UPWARD lists {m} -> {f}, which no import needs: remove it"
              for m, f in sorted(KNOWN_UPWARD - used) if m in graph]
    return found


def test_no_import_runs_up_a_folder():
    graph = folder_imports()
    assert not (found := folder_violations(graph)), "\n".join(found)
    edges = {(m.split(".")[0], t.split(".")[0]) for m, ts in graph.items() for t in ts
             if (m, t.split(".")[0]) not in KNOWN_UPWARD}
    order = graphlib.TopologicalSorter({f: {t for s, t in edges if s == f and t != f}
                                        for f in FOLDERS})
    assert len(list(order.static_order())) == len(FOLDERS)  # graphlib.CycleError on a cycle


@pytest.mark.parametrize(("module", "target"), [
    ("judge.core", "trainer.grpo"),                    # up a folder
    ("envfarm.farm._core", "judge"),                   # up, and not a known edge
    ("tests.envfarm.test_x", "benchmarks.farm.bench"), # the suite needs no benchmark
    ("cluster.local_cluster", "tests.fakes.toy_env"),  # nothing but benchmarks uses the tests
    ("benchmarks.synth.bench", "tests.synth.scripted"),  # past the fakes
    ("tests.fakes.factory_agent", "tests.synth.words"),  # the fakes lean on nothing of tests
])
def test_the_folder_check_catches(module, target):
    assert folder_violations({module: {target}})


def test_the_folder_check_allows_the_fakes_and_shrinks():
    assert not folder_violations({"benchmarks.judge.bench": {"tests.fakes.mock_openai", "judge"},
                                  "tests.synth.test_x": {"tests.fakes", "cluster.haproxy"},
                                  "envfarm.compose": {"judge"}})
    assert folder_violations({"envfarm.cli": {"envfarm.errors"}})  # a stale known edge


_BLOCKED = """
import sys
BLOCKED = ("fastapi", "fastmcp", "uvicorn", "sqlalchemy", "ray", "starlette", "judge", "synth")
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: the SDK must not need it")
sys.meta_path.insert(0, _Block())
import envfarm.errors, envfarm.models, envfarm.wire, envfarm.verdict
from envfarm.client import AgentError, LeaseLost, SyncFarm
from envfarm.errors import EnvNotFound, TaskNotFound

def raises(kind, call):
    try:
        call()
    except kind:
        return
    raise AssertionError(f"expected {kind.__name__}")

with SyncFarm(sys.argv[1]) as farm:
    raises(EnvNotFound, lambda: farm.acquire("no_such_env"))
    with farm.lease("hotel_booking_1", task_idx=0) as lease:
        assert lease.call("search_hotels", {"city": "Lisbon"})["hotels"]
        raises(AgentError, lambda: lease.call("no_such_tool"))
        verdict = lease.verify()
        assert verdict.outcome.value == "agent_error" and verdict.reward == 0.0, verdict
        raises(TaskNotFound, lambda: lease.verify(task_idx=99))
    raises(LeaseLost, lease.tools)
assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED]
print("ok")
"""


def test_the_sdk_runs_episodes_without_the_server_side():
    from envfarm.compose import LocalFarm
    from envfarm.farm import FarmConfig, PoolConfig

    with LocalFarm(FarmConfig(envs=["hotel_booking_1"], pool=PoolConfig(warm=1))) as farm:
        out = subprocess.run([sys.executable, "-c", _BLOCKED, farm.url], check=False,
                             capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
