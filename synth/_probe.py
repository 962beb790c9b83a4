"""Loading generated env code in envfarm's runtime (probing its tools is ``envfarm.check.probe_tools``)."""

from __future__ import annotations

from typing import Any

from envfarm import EnvBundle, EnvRuntime
from envfarm.errors import EnvfarmError
from envfarm.models import DBSchema, SampleData


def make_bundle(name: str, *, db: dict[str, Any] | None, sample: dict[str, Any] | None,
                spec: dict[str, Any] | None, code: str | None, tasks: list[str] | None = None,
                description: str = "") -> EnvBundle:
    """An :class:`envfarm.EnvBundle` from this run's stage records."""
    return EnvBundle(
        name=name, description=description, tasks=tasks or [],
        db_schema=DBSchema.model_validate(db["db_schema"]) if db else None,
        sample_data=SampleData.model_validate(sample["sample_data"]) if sample else None,
        api_spec=spec["api_spec"] if spec else None, code=code,
    )


def load_runtime(bundle: EnvBundle, timeout_s: float) -> tuple[EnvRuntime | None, str | None]:
    """``(runtime, None)`` or ``(None, why it does not load)``; never raises for bad env code."""
    try:
        return EnvRuntime(bundle, call_timeout_s=timeout_s), None
    except EnvfarmError as exc:
        return None, f"env does not load: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - generated code may fail in any way while loading
        return None, f"env does not load: {type(exc).__name__}: {exc}"
