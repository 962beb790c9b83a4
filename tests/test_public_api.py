"""Each package's public surface: one sorted __all__, every name importable."""

from __future__ import annotations

import importlib

import pytest


def _isort_key(name: str) -> tuple[int, str]:
    # ruff RUF022's order: CONSTANTS, then Classes, then functions.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


#: Every public face: the contracts, the runtime, the farm, the SDK, the LLM client, the judge,
#: the hack probes, the composition and the Serve shell.
PUBLIC = ["envfarm", "envfarm.errors", "envfarm.models", "envfarm.wire", "envfarm.verdict",
          "envfarm.llm", "envfarm.farm", "envfarm.client", "envfarm.hackprobes", "envfarm.compose",
          "envfarm.serve", "judge"]


@pytest.mark.parametrize("module", PUBLIC)
def test_all_is_sorted_and_importable(module):
    mod = importlib.import_module(module)
    assert list(mod.__all__) == sorted(mod.__all__, key=_isort_key), f"{module}.__all__ drifted"
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert not missing


def test_error_tree_has_one_root_and_one_status_table():
    from envfarm import errors

    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, Exception) and c.__module__ == errors.__name__]
    assert all(issubclass(c, errors.EnvfarmError) for c in classes)
    for cls, status in errors.HTTP_STATUS.items():
        assert cls.status_code == status and isinstance(cls.kind, errors.ErrorKind)
    assert not any(c.__name__ == "EnvironmentError" for c in classes)  # a builtin alias of OSError


def test_one_definition_of_each_contract():
    """The judge and the farm re-export the contracts; they do not define their own."""
    import envfarm
    import envfarm.farm
    import judge
    from envfarm import errors, models, verdict, wire

    for name in ("REWARDS", "Outcome", "Verdict", "reward_for"):
        assert getattr(judge, name) is getattr(verdict, name)
    for name in ("LeaseInfo", "VerifyResponse", "BatchResult", "EnvSummary", "owner_of"):
        assert getattr(envfarm.farm, name) is getattr(wire, name)
    for name in ("BadRequest", "PayloadTooLarge", "TaskNotFound"):
        assert getattr(envfarm.farm, name) is getattr(errors, name)
    assert envfarm.CallResult is models.CallResult
    assert issubclass(wire.VerifyResponse, verdict.Verdict)  # the farm's verdict is the judge's


def test_every_error_class_has_a_wire_type_the_sdk_reads_back():
    from envfarm import errors
    from envfarm.client import LeaseLost, error_from_wire

    for cls, status in errors.HTTP_STATUS.items():
        body = {"error": cls("boom", lease_id="p1-ab").to_dict()}
        exc = error_from_wire(errors.http_status(cls), __import__("json").dumps(body).encode())
        want = LeaseLost if cls is errors.LeaseGone else cls
        assert type(exc) is want and exc.message == "boom" and exc.lease_id == "p1-ab", cls


def test_the_package_root_loads_its_names_on_first_use():
    import subprocess
    import sys

    code = ("import sys, envfarm, envfarm.errors\n"
            "assert 'sqlalchemy' not in sys.modules and 'envfarm.runtime' not in sys.modules\n"
            "assert envfarm.EnvRuntime.__module__ == 'envfarm.runtime'\n"
            "assert envfarm.runtime.EnvRuntime is envfarm.EnvRuntime\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
