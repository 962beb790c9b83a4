"""``--no-ray``: the whole farm in one uvicorn process (debug mode and throughput ceiling).

``envfarm.compose.LocalFarm`` runs one on a background thread, with the judge handed in.
"""

from __future__ import annotations

import socket

import uvicorn

from envfarm.farm._app import build_app
from envfarm.farm._core import FarmCore


def make_server(core: FarmCore, host: str = "127.0.0.1", port: int = 8000) -> uvicorn.Server:
    # Keep-alive well past the SDK's 3 s pool expiry: with uvicorn's 5 s, a starved client (a
    # loaded machine, a long cold start) reused connections the server was closing (ReadError).
    # No per-message deflate on the OpenEnv sockets: a zlib stream per socket costs memory per
    # open session and was the client's largest CPU item on small messages (1.1 of 8.2 s).
    config = uvicorn.Config(build_app(core), host=host, port=port, log_level="warning",
                            access_log=False, lifespan="on", timeout_graceful_shutdown=5,
                            timeout_keep_alive=30, ws_per_message_deflate=False)
    return uvicorn.Server(config)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
