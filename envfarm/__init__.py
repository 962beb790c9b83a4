"""envfarm: serve SQLite-backed tool-use environments to RL trainers.

The runtime (this package minus ``envfarm.serve``) imports nothing from Ray.
"""

from envfarm.catalog import Catalog, load_catalog, normalize_name
from envfarm.errors import EnvfarmError
from envfarm.models import CallResult, EnvBundle, ToolCall, ToolError, ToolSpec, Verifier
from envfarm.runtime import EnvRuntime, Instance
from envfarm.template import TemplateBuild, build_template

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
