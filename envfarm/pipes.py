"""Blocking reads from a pipe with a deadline: the front's side of both child-process channels
(env workers, ``envfarm.worker``; verifier children, ``judge.sandbox``)."""

from __future__ import annotations

import os
import select
import time


def wait_readable(fd: int, timeout_s: float) -> bool:
    """Whether ``fd`` has something to read (or was closed) within ``timeout_s``. ``poll``, not
    ``select``: a front holding more than 1,024 sockets (OpenEnv sessions) gets higher fds."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(timeout_s, 0.0) * 1000))


def read_exact(fd: int, n: int, deadline: float) -> bytes:
    """Exactly ``n`` bytes from ``fd`` by ``deadline`` (``time.monotonic()``); ``TimeoutError``
    past it, ``EOFError`` if the writer closed first."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not wait_readable(fd, left):
            raise TimeoutError
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)
