"""Calling deployments through handles from inside Serve (front app, in-cluster trainers)."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any


async def fresh_call(method: Any, *args: Any, **kwargs: Any) -> Any:
    """``await method.remote(...)`` as a request of its own.

    A handle call made while a replica serves a request inherits that request's internal id;
    a custom request router matches pending requests by that id, so sibling calls of one request
    collide and one is never routed. An empty context gives each call a fresh id.
    """
    async def run() -> Any:
        return await method.remote(*args, **kwargs)

    return await asyncio.get_running_loop().create_task(run(), context=contextvars.Context())
