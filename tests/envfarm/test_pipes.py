"""The front's deadline-bounded pipe reads work past fd 1,024 (a front holding many sockets:
select() refused them, and env workers stopped starting past 1,024 OpenEnv sessions)."""

from __future__ import annotations

import contextlib
import os
import time

import pytest

from envfarm.pipes import read_exact


@pytest.fixture
def high_fd_pipe():
    """A pipe whose read end is above 1,024 (what a front with 1,024+ open sessions gets)."""
    spare = [os.pipe() for _ in range(520)]
    r, w = os.pipe()
    try:
        assert r > 1024
        yield r, w
    finally:
        for fd in (r, w, *(fd for pair in spare for fd in pair)):
            with contextlib.suppress(OSError):
                os.close(fd)


def test_read_exact_on_a_high_fd(high_fd_pipe):
    r, w = high_fd_pipe
    os.write(w, b"hello")
    assert read_exact(r, 5, time.monotonic() + 1) == b"hello"
    with pytest.raises(TimeoutError):
        read_exact(r, 1, time.monotonic() + 0.05)
    os.close(w)
    with pytest.raises(EOFError):
        read_exact(r, 1, time.monotonic() + 1)
