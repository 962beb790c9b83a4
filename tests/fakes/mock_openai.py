"""A real OpenAI-compatible HTTP server on 127.0.0.1 that answers from a script.

Start it, point any OpenAI client at ``.url``, script what it answers, read what it received::

    from tests.fakes.mock_openai import MockOpenAI, Reply

    with MockOpenAI(latency_s=0.2) as mock:              # random free port, background thread
        client = LLMClient(LLMConfig(base_url=mock.url, model="mock"))
        mock.script("plain text answer")                  # any request, consumed once
        mock.script('{"verdict": "Completed"}', pattern=r"Trajectory")   # regex on the last user message
        mock.script(Reply.error(429), Reply.error(500), "ok", stage="db") # queue for requests with stage "db"
        mock.script(lambda req: f"echo {req.last_user}", repeat=True)    # callable, never used up
        mock.script('{"broken json', scenario="shop_1")   # malformed JSON *content*
        mock.script(Reply(raw_body="<html>oops"))          # a body that is not JSON at all (HTTP 200)
        ...
        mock.requests      # list[SeenRequest]: .path .body .stage .scenario .last_user .messages .model
        mock.unmatched     # requests no rule answered (they got HTTP 400 "mock: no scripted reply")

Matching: rules are tried in the order they were added; a rule matches when all of its
filters match (``stage`` / ``scenario`` compare the ``X-Envfarm-Stage`` / ``X-Envfarm-Scenario``
headers that ``envfarm.llm.LLMClient`` sends; ``pattern`` is ``re.search`` on the last user
message, DOTALL; ``match`` is any predicate on the :class:`SeenRequest`) and it still has replies.
Replies of a rule are used one per request, in order; with ``repeat=True`` the last one is
served forever. A reply is a ``str`` (the assistant content), a :class:`Reply` (status codes,
raw bodies, per-reply latency, token counts), or a callable ``SeenRequest -> str | Reply``.
``fallback`` (constructor or attribute) answers whatever no rule matched.

``latency_s`` (constructor or attribute) delays every answer with ``asyncio.sleep`` (concurrent
requests overlap, as a real endpoint's would). ``POST /v1/embeddings`` answers deterministic
hashed bag-of-words vectors unless ``embed_fn(texts) -> list[list[float]]`` is given.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response


@dataclass
class SeenRequest:
    """One request the server received."""

    path: str
    body: Any
    headers: dict[str, str]
    received_at: float

    @property
    def stage(self) -> str:
        return self.headers.get("x-envfarm-stage", "")

    @property
    def scenario(self) -> str:
        return self.headers.get("x-envfarm-scenario", "")

    @property
    def model(self) -> str:
        return (self.body or {}).get("model", "") if isinstance(self.body, dict) else ""

    @property
    def messages(self) -> list[dict[str, Any]]:
        return (self.body or {}).get("messages", []) if isinstance(self.body, dict) else []

    @property
    def last_user(self) -> str:
        for msg in reversed(self.messages):
            if msg.get("role") == "user":
                return _content_text(msg.get("content"))
        return ""

    @property
    def prompt(self) -> str:
        """All message contents joined: handy for regexes over system + user text."""
        return "\n".join(_content_text(m.get("content")) for m in self.messages)


@dataclass
class Reply:
    """A scripted answer: assistant ``text``, or an HTTP ``status`` error, or a verbatim ``raw_body``."""

    text: str | None = None
    status: int = 200
    raw_body: str | None = None
    latency_s: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @classmethod
    def error(cls, status: int, message: str = "scripted failure", **kw: Any) -> Reply:
        """An OpenAI-style error body with the given HTTP status (429, 500, 503 ...)."""
        body = json.dumps({"error": {"message": message, "type": "mock_error", "code": status}})
        return cls(status=status, raw_body=body, **kw)


ReplyLike = Union[str, Reply, Callable[[SeenRequest], Union[str, Reply]]]


@dataclass
class Rule:
    """Filters plus a queue of replies."""

    replies: list[ReplyLike]
    stage: str | None = None
    scenario: str | None = None
    pattern: re.Pattern[str] | None = None
    match: Callable[[SeenRequest], bool] | None = None
    repeat: bool = False
    served: int = 0

    def matches(self, req: SeenRequest) -> bool:
        if not self.replies:
            return False
        if self.stage is not None and req.stage != self.stage:
            return False
        if self.scenario is not None and req.scenario != self.scenario:
            return False
        if self.pattern is not None and not self.pattern.search(req.last_user):
            return False
        return self.match is None or bool(self.match(req))

    def take(self) -> ReplyLike:
        self.served += 1
        if self.repeat and len(self.replies) == 1:
            return self.replies[0]
        return self.replies.pop(0)

    @property
    def remaining(self) -> int:
        return len(self.replies)


class MockOpenAI:
    """The server; a context manager (or call ``start()`` / ``stop()``)."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        fallback: ReplyLike | None = None,
        embed_fn: Callable[[list[str]], list[list[float]]] | None = None,
        embed_dim: int = 256,
    ) -> None:
        self.latency_s = latency_s
        self.fallback = fallback
        self.embed_fn = embed_fn
        self.embed_dim = embed_dim
        self.requests: list[SeenRequest] = []
        self.unmatched: list[SeenRequest] = []
        self.rules: list[Rule] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- scripting -------------------------------------------------------------------------
    def script(
        self,
        *replies: ReplyLike,
        stage: str | None = None,
        scenario: str | None = None,
        pattern: str | None = None,
        match: Callable[[SeenRequest], bool] | None = None,
        repeat: bool = False,
    ) -> Rule:
        """Add a rule answering matching requests with ``replies`` in order (see module doc)."""
        rule = Rule(
            replies=list(replies),
            stage=stage,
            scenario=scenario,
            pattern=re.compile(pattern, re.DOTALL) if pattern is not None else None,
            match=match,
            repeat=repeat,
        )
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Forget every rule and every recorded request."""
        with self._lock:
            self.rules.clear()
            self.requests.clear()
            self.unmatched.clear()

    def requests_for(self, *, stage: str | None = None, scenario: str | None = None) -> list[SeenRequest]:
        """Chat requests filtered by stage / scenario header."""
        return [
            r for r in self.requests
            if r.path.endswith("/chat/completions")
            and (stage is None or r.stage == stage)
            and (scenario is None or r.scenario == scenario)
        ]

    @property
    def url(self) -> str:
        """Base URL for the OpenAI SDK (ends in ``/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> MockOpenAI:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="warning", access_log=False, lifespan="off", ws="none")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True, name="mock-openai")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("mock OpenAI server did not start")
            time.sleep(0.005)
        self._sock = sock
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if getattr(self, "_sock", None) is not None:
            self._sock.close()
        self._server = self._thread = None

    def __enter__(self) -> MockOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the app ---------------------------------------------------------------------------
    def _pick(self, req: SeenRequest) -> ReplyLike | None:
        with self._lock:
            self.requests.append(req)
            for rule in self.rules:
                if rule.matches(req):
                    return rule.take()
            if self.fallback is not None:
                return self.fallback
            self.unmatched.append(req)
            return None

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            try:
                body = await request.json()
            except ValueError:
                return JSONResponse({"error": {"message": "body is not JSON"}}, status_code=400)
            seen = SeenRequest(path=request.url.path, body=body, headers=dict(request.headers), received_at=time.monotonic())
            reply_like = self._pick(seen)
            with self._lock:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if reply_like is None:
                    return JSONResponse(
                        {"error": {"message": f"mock: no scripted reply for stage={seen.stage!r} "
                                              f"scenario={seen.scenario!r} last user message {seen.last_user[:200]!r}"}},
                        status_code=400,
                    )
                reply = reply_like(seen) if callable(reply_like) else reply_like
                if isinstance(reply, str):
                    reply = Reply(text=reply)
                delay = self.latency_s if reply.latency_s is None else reply.latency_s
                if delay:
                    await asyncio.sleep(delay)
                return _render(reply, seen)
            finally:
                with self._lock:
                    self.in_flight -= 1

        @app.post("/v1/embeddings")
        async def embeddings(request: Request) -> Response:
            body = await request.json()
            seen = SeenRequest(path=request.url.path, body=body, headers=dict(request.headers), received_at=time.monotonic())
            with self._lock:
                self.requests.append(seen)
            texts = body.get("input", [])
            texts = [texts] if isinstance(texts, str) else list(texts)
            vectors = self.embed_fn(texts) if self.embed_fn else [_hash_embed(t, self.embed_dim) for t in texts]
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            return JSONResponse({
                "object": "list",
                "model": body.get("model", "mock-embed"),
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": sum(len(t) // 4 for t in texts), "total_tokens": sum(len(t) // 4 for t in texts)},
            })

        return app


def _render(reply: Reply, seen: SeenRequest) -> Response:
    if reply.raw_body is not None:
        return Response(reply.raw_body, status_code=reply.status, headers=reply.headers, media_type="application/json")
    if reply.status != 200:
        return JSONResponse({"error": {"message": reply.text or "scripted failure"}}, status_code=reply.status, headers=reply.headers)
    text = reply.text or ""
    prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else max(1, len(seen.prompt) // 4)
    completion_tokens = reply.completion_tokens if reply.completion_tokens is not None else max(1, len(text) // 4)
    return JSONResponse({
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": seen.model or "mock",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }, headers=reply.headers)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multi-part content
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _hash_embed(text: str, dim: int) -> list[float]:
    """Deterministic bag-of-words vector: equal word sets give cosine 1, disjoint ones ~0."""
    vec = [0.0] * dim
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        h = int(hashlib.sha256(word.encode()).hexdigest(), 16)
        vec[h % dim] += 1.0 if (h >> 8) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]
