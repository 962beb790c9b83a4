"""Host code that may find itself running on env code's thread.

The cyclic collector runs finalizers in whichever thread allocates, env code included, where
the process-wide refusals (``_confine``, the audit hook) would stop them: a worker's reaper
could not kill it, a verifier sandbox could not remove its staging files.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from envfarm.confined._guard import host_code


def host_finalizer(obj: object, func: Callable[..., Any], *args: Any) -> weakref.finalize:
    """``weakref.finalize(obj, func, *args)`` whose ``func`` always runs as host code."""
    return weakref.finalize(obj, _as_host, func, *args)


def _as_host(func: Callable[..., Any], *args: Any) -> Any:
    with host_code():
        return func(*args)
