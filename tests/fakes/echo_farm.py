"""A farm-shaped HTTP server that does no work: it grants leases and echoes tool calls.

For measuring and stress-testing the SDK's client side alone (its transport's CPU per call,
thousands of concurrent calls): the server answers in a few microseconds, so what a test sees
is the client. A real uvicorn (httptools) in its own process on 127.0.0.1::

    with EchoFarm() as farm:                  # random free port, a child process
        async with Farm(farm.url) as sdk:
            lease = await sdk.acquire("echo")
            await lease.call("echo", {"n": 1})   # -> {"tool": "echo", "arguments": {"n": 1}}
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

_ROOT = Path(__file__).resolve().parents[2]


async def app(scope, receive, send) -> None:
    """POST /envs/{env}/leases, POST …/leases/{id}/call (echoes), DELETE …/leases/{id}."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    parts = scope["path"].strip("/").split("/")
    method = scope["method"]
    if method == "POST" and len(parts) == 3 and parts[2] == "leases":
        status, answer = 201, {"lease_id": "r0-0001", "env": parts[1], "token": "t" * 32,
                               "expires_at": time.time() + 3600, "idle_timeout_s": 600,
                               "mcp_url": f"/envs/{parts[1]}/leases/r0-0001/mcp"}
    elif method == "POST" and len(parts) == 5 and parts[4] == "call":
        request = json.loads(body)
        status, answer = 200, {"ok": True, "status": 200, "elapsed_ms": 0.0,
                               "result": {"tool": request["tool"],
                                          "arguments": request.get("arguments", {})}}
    elif method == "DELETE" and len(parts) == 4:
        status, answer = 200, {"lease_id": parts[3], "status": "closed"}
    else:
        status, answer = 404, {"error": {"kind": "not_found", "message": scope["path"]}}
    data = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


class EchoFarm:
    """The echo server in a child process (uvicorn, httptools, 127.0.0.1, a free port)."""

    def __init__(self, backlog: int = 8192) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.backlog = backlog
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> EchoFarm:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.fakes.echo_farm:app", "--host",
             "127.0.0.1", "--port", str(self.port), "--http", "httptools", "--log-level",
             "warning", "--no-access-log", "--backlog", str(self.backlog),
             "--timeout-keep-alive", "30"], cwd=_ROOT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.post(self.url + "/envs/echo/leases", json={}).status_code == 201:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("the echo farm did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
