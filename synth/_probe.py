"""Loading generated env code in envfarm's runtime and probing every tool with example arguments."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from envfarm import EnvBundle, EnvRuntime
from envfarm.check import example_arguments, spec_endpoints
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


@dataclass
class ProbeReport:
    """What probing an env found."""

    tools: int = 0
    errors: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)


async def probe(runtime: EnvRuntime, api_spec: dict[str, Any] | None) -> ProbeReport:
    """Every spec operation must be a tool; every tool must answer example arguments without a 5xx."""
    endpoints = spec_endpoints(api_spec)
    tools = {t.name: t for t in runtime.tools}
    report = ProbeReport(tools=len(tools))
    if not tools:
        report.errors.append("the app exposes no tools (no routes with operation_id)")
    missing = sorted(set(endpoints) - set(tools))
    if missing:
        report.errors.append(f"spec operations with no route (operation_id): {missing}")
    inst = runtime.instance()
    try:
        for name, tool in tools.items():
            args = example_arguments(tool, endpoints.get(name))
            inst.reset()
            res = await inst.call(name, args)
            report.calls.append({"tool": name, "arguments": args, "ok": res.ok, "status": res.status})
            if not res.ok and res.error is not None and res.error.kind == "env_error":
                report.errors.append(f"tool {name} with example arguments {args} -> server error: {res.error.message}")
            await asyncio.sleep(0)  # let other scenarios' work interleave
    finally:
        inst.close()
    return report
