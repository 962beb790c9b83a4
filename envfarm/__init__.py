"""envfarm: serve SQLite-backed tool-use environments to RL trainers.

Nothing in this package imports Ray (the Serve shell is ``cluster.serve``). Names below load on
first use (PEP 562), so ``import envfarm.errors`` or the SDK does not pull in the runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envfarm.catalog import Catalog, load_catalog, normalize_name
    from envfarm.confined.runtime import EnvRuntime, Instance
    from envfarm.confined.template import TemplateBuild, build_template
    from envfarm.errors import EnvfarmError
    from envfarm.models import CallResult, EnvBundle, ToolCall, ToolError, ToolSpec, Verifier

#: public name -> module that defines it
_HOMES = {
    "CallResult": "envfarm.models",
    "Catalog": "envfarm.catalog",
    "EnvBundle": "envfarm.models",
    "EnvRuntime": "envfarm.confined.runtime",
    "EnvfarmError": "envfarm.errors",
    "Instance": "envfarm.confined.runtime",
    "TemplateBuild": "envfarm.confined.template",
    "ToolCall": "envfarm.models",
    "ToolError": "envfarm.models",
    "ToolSpec": "envfarm.models",
    "Verifier": "envfarm.models",
    "build_template": "envfarm.confined.template",
    "load_catalog": "envfarm.catalog",
    "normalize_name": "envfarm.catalog",
}

__all__ = [
    "CallResult",
    "Catalog",
    "EnvBundle",
    "EnvRuntime",
    "EnvfarmError",
    "Instance",
    "TemplateBuild",
    "ToolCall",
    "ToolError",
    "ToolSpec",
    "Verifier",
    "build_template",
    "load_catalog",
    "normalize_name",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        from importlib.util import find_spec  # here: a verifier zygote imports envfarm.confined.jail

        if find_spec(f"envfarm.{name}") is not None:
            return importlib.import_module(f"envfarm.{name}")  # ``envfarm.catalog`` etc.
        raise AttributeError(f"module 'envfarm' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
