"""The front <-> env-worker channel: one framed message each way per request.

A frame is ``u32 length`` then ``u32 header length``, a JSON header (small: ids, op, outcome)
and a raw payload (a call's ``CallResult`` JSON, a database image). The front never unpickles
anything a worker sends, and bounds every frame it reads.
"""

from __future__ import annotations

import json
import os
from typing import Any

from envfarm.pipes import read_exact

#: Largest frame either side accepts (a database image is the biggest thing sent).
MAX_FRAME = 64 << 20
_U32 = 4


class FrameError(Exception):
    """The peer sent something that is not a well-formed frame."""


def encode(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join(((_U32 + len(head) + len(payload)).to_bytes(_U32, "big"),
                     len(head).to_bytes(_U32, "big"), head, payload))


def decode(body: bytes | memoryview) -> tuple[dict[str, Any], bytes]:
    """``(header, payload)`` of one frame's body (the bytes after its length)."""
    if len(body) < _U32:
        raise FrameError("frame shorter than its header length")
    size = int.from_bytes(body[:_U32], "big")
    if size > len(body) - _U32:
        raise FrameError("header length past the end of the frame")
    try:
        header = json.loads(bytes(body[_U32:_U32 + size]))
    except ValueError as exc:
        raise FrameError(f"unreadable header: {exc}") from None
    if not isinstance(header, dict):
        raise FrameError("header is not a JSON object")
    return header, bytes(body[_U32 + size:])


class FrameReader:
    """Splits a byte stream into frame bodies (feed it what ``data_received`` gets)."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out = []
        while len(self._buf) >= _U32:
            size = int.from_bytes(self._buf[:_U32], "big")
            if size > self._max or size < _U32:
                raise FrameError(f"frame of {size} bytes (limit {self._max})")
            if len(self._buf) < _U32 + size:
                break
            out.append(bytes(self._buf[_U32:_U32 + size]))
            del self._buf[:_U32 + size]
        return out


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_blocking(fd: int, deadline: float, max_frame: int = MAX_FRAME
                  ) -> tuple[dict[str, Any], bytes]:
    """One frame from a blocking fd before ``deadline`` (monotonic); TimeoutError / EOFError."""
    size = int.from_bytes(read_exact(fd, _U32, deadline), "big")
    if size > max_frame or size < _U32:
        raise FrameError(f"frame of {size} bytes (limit {max_frame})")
    return decode(read_exact(fd, size, deadline))
