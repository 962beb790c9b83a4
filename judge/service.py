"""The judge as a Ray Serve deployment that batches requests (``@serve.batch``).

Each replica owns one :class:`judge.Judge` (a verifier sandbox and an LLM client). Requests
arriving together are judged as one batch: verifier runs share the worker pool and the LLM
calls of a batch, and of up to 16 batches, are in flight together.

    app = judge_app(JudgeServiceConfig())       # serve.run(app) — HTTP: POST /judge
    handle = serve.run(app, _local_testing_mode=True)
    verdict = await handle.judge.remote(request)   # a JudgeRequest or its dict

Anything that starts Ray runs inside a private network namespace (docs/architecture.md,
"Networking").
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve.deployment import Application
from starlette.requests import Request
from starlette.responses import JSONResponse

from envfarm.verdict import Verdict
from judge.core import Judge, JudgeConfig, JudgeRequest
from judge.http import answer_body


class JudgeServiceConfig(BaseModel):
    """How the judge deployment batches and scales."""

    model_config = ConfigDict(extra="forbid")

    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="the judge itself")
    llm: dict[str, Any] = Field(default_factory=dict,
                                description="envfarm.llm.LLMConfig overrides (base_url, model …)")
    max_batch_size: int = Field(default=64, ge=1, description="requests per batch")
    batch_wait_timeout_s: float = Field(default=0.01, ge=0,
                                        description="how long a batch waits to fill")
    num_replicas: int = Field(default=1, ge=1, description="replicas of the deployment")
    max_ongoing_requests: int = Field(default=4096, ge=1,
                                      description="requests a replica accepts at once")


@serve.deployment(name="judge")
class JudgeDeployment:
    """One replica: a Judge behind a batching queue."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = JudgeServiceConfig.model_validate(config or {})
        self._judge = Judge.from_env(self.config.judge, **self.config.llm)
        self._batch.set_max_batch_size(self.config.max_batch_size)
        self._batch.set_batch_wait_timeout_s(self.config.batch_wait_timeout_s)
        self.batch_sizes: list[int] = []

    # Up to 16 batches in flight per replica: a batch waits on LLM latency, not on CPU.
    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01, max_concurrent_batches=16)
    async def _batch(self, requests: list[JudgeRequest]) -> list[Verdict]:
        self.batch_sizes.append(len(requests))
        return await self._judge.judge_many(requests)

    async def judge(self, request: JudgeRequest | dict[str, Any]) -> Verdict:
        """Judge one episode (batched with whatever else is in flight)."""
        return await self._batch(JudgeRequest.model_validate(request))

    def stats(self) -> dict[str, Any]:
        sizes = self.batch_sizes
        return {"batches": len(sizes), "requests": sum(sizes), "max_batch": max(sizes, default=0),
                "mode": self._judge.mode}

    async def __call__(self, request: Request) -> JSONResponse:
        if request.method == "GET" and request.url.path.rstrip("/").endswith("/healthz"):
            return JSONResponse({"status": "ok", "mode": self._judge.mode})
        if request.method != "POST" or not request.url.path.rstrip("/").endswith("/judge"):
            return JSONResponse({"kind": "not_found", "message": "POST /judge"}, status_code=404)
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"kind": "invalid_request", "message": "body is not JSON"},
                                status_code=400)
        status, payload = await answer_body(body, self._batch)
        return JSONResponse(payload, status_code=status)


def judge_app(config: JudgeServiceConfig | None = None) -> Application:
    """The Serve application; ``serve.run(judge_app(), route_prefix="/")`` serves /judge."""
    config = config or JudgeServiceConfig()
    return JudgeDeployment.options(
        num_replicas=config.num_replicas,
        max_ongoing_requests=config.max_ongoing_requests,
    ).bind(config.model_dump(mode="json"))
