"""The front <-> env-worker channel: one framed message each way per request.

A frame is ``u32 length`` then ``u32 header length``, a JSON header (small: ids, op, outcome)
and a raw payload (a call's ``CallResult`` JSON, a database image or page delta). The front
never unpickles anything a worker sends, and reads a worker's frames with ``ReplyReader``: the
header's size is bounded before it is parsed, the header is parsed (a flat object, no
recursion blow-up) and admitted against the request it answers before a byte of the payload is
kept, and the payload is bounded by that request's own cap.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from envfarm.pipes import read_exact

#: Largest frame either side accepts (a database image is the biggest thing sent).
MAX_FRAME = 64 << 20
#: Largest tool answer (a call's ``CallResult`` JSON) a worker may send: an agent reads it.
#: The worker replaces a larger one by a typed error; the front kills a worker that sends one.
MAX_RESULT_BYTES = 8 << 20
#: Largest header of a worker's reply once it serves (ids, ok, an error message).
MAX_REPLY_HEADER = 4096
#: Largest header of the load reply (the env's tools and OpenAPI; ~150 KB for AWM's largest).
MAX_LOAD_HEADER = 4 << 20
_U32 = 4
_PREFIX = 2 * _U32
_SCALARS = (int, str, bool, float, type(None))


class FrameError(Exception):
    """The peer sent something that is not a well-formed frame. ``rid``: the request whose
    answer broke the rules, when the frame named one the front had sent (that request's lease
    is the guilty one)."""

    def __init__(self, message: str, rid: int | None = None) -> None:
        super().__init__(message)
        self.rid = rid


def encode(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join(((_U32 + len(head) + len(payload)).to_bytes(_U32, "big"),
                     len(head).to_bytes(_U32, "big"), head, payload))


def parse_header(raw: bytes | memoryview) -> dict[str, Any]:
    """A header's JSON object; FrameError for anything else (a nesting too deep for the parser
    included: ``RecursionError`` never leaves here)."""
    try:
        header = json.loads(bytes(raw))
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"unreadable header: {type(exc).__name__}") from None
    if not isinstance(header, dict):
        raise FrameError("header is not a JSON object")
    return header


def decode(body: bytes | memoryview, max_header: int = MAX_FRAME
           ) -> tuple[dict[str, Any], bytes]:
    """``(header, payload)`` of one frame's body (the bytes after its length)."""
    if len(body) < _U32:
        raise FrameError("frame shorter than its header length")
    size = int.from_bytes(body[:_U32], "big")
    if size > len(body) - _U32:
        raise FrameError("header length past the end of the frame")
    if size > max_header:
        raise FrameError(f"header of {size} bytes (limit {max_header})")
    return parse_header(body[_U32:_U32 + size]), bytes(body[_U32 + size:])


class FrameReader:
    """Splits a byte stream into frame bodies (the worker's side: the front is trusted)."""

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


#: ``admit(header, payload_size)``: raises FrameError to refuse a frame before its payload is
#: read; called once per frame, with the header parsed and checked flat.
Admit = Callable[[dict[str, Any], int], None]
Deliver = Callable[[dict[str, Any], bytes], None]


class ReplyReader:
    """The front's reader of one worker's frames: each frame's header is bounded, parsed,
    checked flat and admitted (``admit``) before its payload is buffered; whole frames go to
    ``deliver`` as they complete (those before a refused one are delivered)."""

    def __init__(self, admit: Admit, deliver: Deliver, max_header: int = MAX_REPLY_HEADER,
                 max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._admit = admit
        self._deliver = deliver
        self._max_header = max_header
        self._max_frame = max_frame
        self._current: tuple[dict[str, Any], int] | None = None  # admitted, payload pending

    def feed(self, data: bytes) -> None:
        self._buf += data
        while True:
            if self._current is None and not self._next_header():
                return
            header, size = self._current
            if len(self._buf) < size:
                return
            payload = bytes(self._buf[:size])
            del self._buf[:size]
            self._current = None
            self._deliver(header, payload)

    def _next_header(self) -> bool:
        """Parse and admit the next frame's header if it is all here (False: not yet)."""
        buf = self._buf
        if len(buf) < _PREFIX:
            return False
        size = int.from_bytes(buf[:_U32], "big")
        head = int.from_bytes(buf[_U32:_PREFIX], "big")
        if size > self._max_frame or size < _U32 or head > size - _U32:
            raise FrameError(f"frame of {size} bytes, header {head} (limit {self._max_frame})")
        if head > self._max_header:
            raise FrameError(f"header of {head} bytes (limit {self._max_header})")
        if len(buf) < _PREFIX + head:
            return False
        header = parse_header(memoryview(buf)[_PREFIX:_PREFIX + head])
        if not all(isinstance(v, _SCALARS) for v in header.values()):
            raise FrameError("header values must be plain scalars", rid=_rid(header))
        payload = size - _U32 - head
        self._admit(header, payload)
        del buf[:_PREFIX + head]
        self._current = (header, payload)
        return True


def _rid(header: dict[str, Any]) -> int | None:
    rid = header.get("id")
    return rid if isinstance(rid, int) and not isinstance(rid, bool) else None


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_blocking(fd: int, deadline: float, max_frame: int = MAX_FRAME,
                  max_header: int = MAX_LOAD_HEADER) -> tuple[dict[str, Any], bytes]:
    """One frame from a blocking fd before ``deadline`` (monotonic); TimeoutError / EOFError."""
    size = int.from_bytes(read_exact(fd, _U32, deadline), "big")
    if size > max_frame or size < _U32:
        raise FrameError(f"frame of {size} bytes (limit {max_frame})")
    return decode(read_exact(fd, size, deadline), max_header)


# -- committed state: a database image as page deltas ------------------------------------------
#: Largest database image of one lease the front keeps (and a worker may ship).
MAX_DB_BYTES = MAX_FRAME
_DELTA_HEAD = 3 * _U32


def page_size(image: bytes | memoryview) -> int:
    """The page size an SQLite image declares (bytes 16-17; 1 means 65,536)."""
    if len(image) < 100:
        return 4096
    size = int.from_bytes(image[16:18], "big")
    return 65536 if size == 1 else size


def encode_delta(old: bytes, new: bytes) -> bytes:
    """The pages of ``new`` that differ from ``old`` (or lie past its end): ``u32 image size,
    u32 page size, u32 count``, ``count`` u32 page numbers, then those pages."""
    size = page_size(new)
    kept = len(old) if page_size(old) == size else 0
    changed = [i for i in range(-(-len(new) // size))
               if (i + 1) * size > kept or old[i * size:(i + 1) * size]
               != new[i * size:(i + 1) * size]]
    return b"".join((len(new).to_bytes(_U32, "big"), size.to_bytes(_U32, "big"),
                     len(changed).to_bytes(_U32, "big"),
                     *(i.to_bytes(_U32, "big") for i in changed),
                     *(new[i * size:(i + 1) * size] for i in changed)))


def decode_delta(delta: bytes | memoryview, pages: int, size: int
                 ) -> tuple[int, int, list[tuple[int, bytes]]]:
    """``(image size, page size, [(page number, page)])`` of a delta against an image of
    ``pages`` pages of ``size`` bytes; FrameError unless it is exactly well formed (bounded,
    page numbers ascending, every page past the old end present)."""
    if len(delta) < _DELTA_HEAD:
        raise FrameError("state delta shorter than its header")
    total, psize, count = (int.from_bytes(delta[i:i + _U32], "big") for i in (0, 4, 8))
    if psize < 512 or psize > 65536 or psize & (psize - 1) or total % psize:
        raise FrameError(f"state delta of {total} bytes in pages of {psize}")
    if total > MAX_DB_BYTES:
        raise FrameError(f"state of {total} bytes (limit {MAX_DB_BYTES})")
    npages = total // psize
    if len(delta) != _DELTA_HEAD + count * (_U32 + psize) or count > npages:
        raise FrameError("state delta of the wrong length")
    at = _DELTA_HEAD + count * _U32
    numbers = [int.from_bytes(delta[_DELTA_HEAD + k * _U32:_DELTA_HEAD + (k + 1) * _U32], "big")
               for k in range(count)]
    if any(b <= a for a, b in zip(numbers, numbers[1:])) or (numbers and numbers[-1] >= npages):
        raise FrameError("state delta page numbers out of order or range")
    have = pages if psize == size else 0
    if set(range(have, npages)) - set(numbers):
        raise FrameError("state delta leaves new pages out")
    return total, psize, [(n, bytes(delta[at + k * psize:at + (k + 1) * psize]))
                          for k, n in enumerate(numbers)]
