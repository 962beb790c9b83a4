"""Blocking reads from a pipe with a deadline: the front's side of both child-process channels
(env workers, ``envfarm.worker``; verifier children, ``judge.sandbox``)."""

from __future__ import annotations

import os
import select
import time


def read_exact(fd: int, n: int, deadline: float) -> bytes:
    """Exactly ``n`` bytes from ``fd`` by ``deadline`` (``time.monotonic()``); ``TimeoutError``
    past it, ``EOFError`` if the writer closed first."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)
