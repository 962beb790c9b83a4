"""Each package's public surface: one sorted __all__, every name importable."""

from __future__ import annotations

import importlib

import pytest


def _isort_key(name: str) -> tuple[int, str]:
    # ruff RUF022's order: CONSTANTS, then Classes, then functions.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


@pytest.mark.parametrize("module", ["envfarm", "envfarm.farm", "envfarm.client", "judge"])
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
