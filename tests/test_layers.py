"""The packages are layered one way, read from the source (every import, lazy ones included):

    contracts < confined < runtime < farm | client < judge < synth < trainer < compose/serve < cli

A module imports only from its own layer group or the ones below; what runs confined (the code
of a process where generated code executes) knows nothing of the front that supervises it; the
farm and the client (one layer, two groups) know nothing of each other; a private module (``x._y``) is imported only from
inside the package ``x``; nothing imports the command line. The SDK's weight is checked by
importing it with the server side blocked.

The top-level folders are layered too (``FOLDERS``, bottom first): no import runs up a folder,
so the folders have no cycle; the test suite and the benchmarks share only ``tests/fakes``. The
composition root (``cluster/``: compose, the Serve shell, the command line) sits above every
package it composes, and ``envfarm/`` imports nothing from Ray.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envfarm", "judge", "synth", "trainer", "cluster")

#: (group, rank, module prefixes); the longest matching prefix places a module.
LAYERS: list[tuple[str, int, tuple[str, ...]]] = [
    ("contracts", 0, ("envfarm.errors", "envfarm.models", "envfarm.wire", "envfarm.verdict")),
    ("plumbing", 0, ("envfarm.asgi", "envfarm.pipes")),
    ("confined", 1, ("envfarm.confined",)),
    ("runtime", 2, ("envfarm", "envfarm.worker", "envfarm.catalog", "envfarm.llm", "envfarm.check")),
    ("farm", 3, ("envfarm.farm",)),
    ("client", 3, ("envfarm.client",)),
    ("judge", 4, ("judge",)),
    ("synth", 5, ("synth",)),
    ("trainer", 6, ("trainer",)),
    ("compose", 7, ("cluster",)),
    ("cli", 8, ("cluster.cli", "cluster.cli_envs", "cluster.cli_farm", "cluster.cli_hacks",
                "cluster.cli_train", "cluster.gpu_check")),
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
    ("envfarm.confined.env_worker", "envfarm.worker", ["WorkerLost"]),  # confined: no front
    ("judge.core", "synth.llm", ["LLMClient"]),             # upward
    ("envfarm.client._client", "envfarm.farm", ["Lease"]),  # sideways: the SDK is light
    ("synth.stages.env", "cluster.cli", ["app"]),           # nothing imports the CLI
    ("cluster.serve._build", "envfarm.farm._http", ["error_response"]),  # private
    ("trainer", "envfarm.farm", ["_core"]),                 # private, spelled the other way
])
def test_the_check_catches(module, target, names):
    assert violations(module, [(1, target, names)])


def test_the_check_allows_what_the_layers_allow():
    assert not violations("cluster.serve._deployments", [(1, "envfarm.asgi", ["call_asgi"])])
    assert not violations("cluster.compose", [(1, "judge", ["Judge"])])
    assert not violations("cluster.cli", [(1, "synth.cli", ["app"])])
    assert not violations("envfarm.farm._core", [(1, "envfarm.farm._pool", ["InstancePool"])])


#: The top-level folders that hold Python, bottom first: a folder imports only from itself and
#: the folders before it. The benchmarks measure what the tests prove, so they sit above them.
FOLDERS = ("envfarm", "judge", "synth", "trainer", "cluster", "tests", "benchmarks")

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
    """Imports up a folder, and imports between tests and benchmarks other than through
    ``tests.fakes``."""
    found = []
    for module, targets in graph.items():
        top = module.split(".")[0]
        for target in sorted(targets):
            to = target.split(".")[0]
            fake = target == "tests.fakes" or target.startswith("tests.fakes.")
            if FOLDERS.index(to) > FOLDERS.index(top):
                found.append(f"{module} ({top}) imports {target} ({to}): up a folder")
            elif top == "benchmarks" and to == "tests" and not fake:
                found.append(f"{module} imports {target}: benchmarks share only tests.fakes")
            elif module.startswith("tests.fakes") and to == "tests" and not fake:
                found.append(f"{module} imports {target}: tests.fakes stands alone")
    return found


def test_no_import_runs_up_a_folder():
    graph = folder_imports()
    assert not (found := folder_violations(graph)), "\n".join(found)
    edges = {(m.split(".")[0], t.split(".")[0]) for m, ts in graph.items() for t in ts}
    order = graphlib.TopologicalSorter({f: {t for s, t in edges if s == f and t != f}
                                        for f in FOLDERS})
    assert len(list(order.static_order())) == len(FOLDERS)  # graphlib.CycleError on a cycle


@pytest.mark.parametrize(("module", "target"), [
    ("judge.core", "trainer.grpo"),                    # up a folder
    ("envfarm.farm._core", "judge"),                   # the farm is handed its judge
    ("envfarm.check", "cluster.compose"),              # the bottom folder composes nothing
    ("tests.envfarm.test_x", "benchmarks.farm.bench"), # the suite needs no benchmark
    ("cluster.local_cluster", "tests.fakes.toy_env"),  # nothing but benchmarks uses the tests
    ("benchmarks.synth.bench", "tests.synth.scripted"),  # past the fakes
    ("tests.fakes.factory_agent", "tests.synth.words"),  # the fakes lean on nothing of tests
])
def test_the_folder_check_catches(module, target):
    assert folder_violations({module: {target}})


def test_the_folder_check_allows_the_fakes_and_what_lies_below():
    assert not folder_violations({"benchmarks.judge.bench": {"tests.fakes.mock_openai", "judge"},
                                  "tests.synth.test_x": {"tests.fakes", "cluster.haproxy"},
                                  "cluster.compose": {"judge"}})


def ray_importers() -> list[str]:
    """The modules under ``envfarm/`` that import Ray, lazy imports included."""
    found = []
    for path in sorted((REPO / "envfarm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            if any(n == "ray" or n.startswith("ray.") for n in names):
                found.append(f"{module_name(path)}:{node.lineno}")
    return found


def test_envfarm_imports_nothing_from_ray():
    """Ray is the composition root's (``cluster.serve``): contracts, runtime, jail, workers, the
    farm's front and the SDK run without it."""
    assert not (found := ray_importers()), "envfarm imports ray: " + ", ".join(found)


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
    from cluster.compose import LocalFarm
    from envfarm.farm import FarmConfig, PoolConfig

    with LocalFarm(FarmConfig(envs=["hotel_booking_1"], pool=PoolConfig(warm=1))) as farm:
        out = subprocess.run([sys.executable, "-c", _BLOCKED, farm.url], check=False,
                             capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
