"""``POST /judge`` as a plain FastAPI app: the same wire format in and out of Ray Serve.

The body is one :class:`JudgeRequest` or a list of them; the answer is one
:class:`JudgeResponse` or a list, in order.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter, ValidationError

from envfarm.verdict import Verdict
from judge.core import Judge, JudgeRequest, JudgeResponse

Submit = Callable[[JudgeRequest], Awaitable[Verdict]]

_BODY: TypeAdapter[JudgeRequest | list[JudgeRequest]] = TypeAdapter(
    JudgeRequest | list[JudgeRequest])


async def answer_body(body: Any, submit: Submit) -> tuple[int, Any]:
    """Validate a ``/judge`` body and judge it: (HTTP status, JSON-ready answer)."""
    try:
        parsed = _BODY.validate_python(body)
    except ValidationError as exc:
        return 422, {"kind": "invalid_request", "message": "bad judge request",
                     "errors": json.loads(exc.json(include_url=False, include_input=False))}
    many = isinstance(parsed, list)
    requests = parsed if many else [parsed]
    verdicts = await asyncio.gather(*(submit(r) for r in requests))
    answers = [JudgeResponse(id=r.id, verdict=v).model_dump(mode="json")
               for r, v in zip(requests, verdicts)]
    return 200, answers if many else answers[0]


def create_app(judge: Judge | None = None, submit: Submit | None = None) -> FastAPI:
    """An app serving ``POST /judge`` and ``GET /healthz`` (no Ray needed)."""
    if submit is None:
        if judge is None:
            raise ValueError("create_app needs a judge or a submit function")
        submit = judge.judge
    app = FastAPI(title="envfarm judge")

    @app.post("/judge")
    async def post_judge(body: Annotated[Any, Body()] = None) -> JSONResponse:
        status, payload = await answer_body(body, submit)
        return JSONResponse(payload, status_code=status)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "mode": judge.mode if judge else "remote"}

    return app
