"""``--no-ray``: the whole farm in one uvicorn process (debug mode and throughput ceiling)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Self

import uvicorn

from envfarm.farm._app import build_app
from envfarm.farm._config import FarmConfig
from envfarm.farm._core import FarmCore


def make_server(core: FarmCore, host: str = "127.0.0.1", port: int = 8000) -> uvicorn.Server:
    config = uvicorn.Config(build_app(core), host=host, port=port, log_level="warning",
                            access_log=False, lifespan="on", timeout_graceful_shutdown=5)
    return uvicorn.Server(config)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalFarm:
    """A ``--no-ray`` farm on a background thread (demo, tests, benchmarks)."""

    def __init__(self, config: FarmConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.core = FarmCore(config)
        self.host = host
        self.port = port or free_port(host)
        self.server = make_server(self.core, host, self.port)
        self._thread = threading.Thread(target=self.server.run, name="envfarm-local",
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> Self:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"local farm did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
