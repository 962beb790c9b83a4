"""A worker that dies before it says ``ready`` says why: its stderr's tail reaches the error.

Before, the front only saw the channel close (``EOFError: ``), whatever the worker's
interpreter printed (a module it could not import, a traceback) went to /dev/null. (That the
front drains a chatty worker's stderr and keeps only its tail: ``test_careless.py``.)
"""

from __future__ import annotations

import pytest

from envfarm.worker._process import WorkerProcess, WorkerStartError


def test_a_worker_that_crashes_at_start_passes_on_its_traceback():
    worker = WorkerProcess({"jail": True, "memory_mb": "lots"})  # its jail cannot take that
    with pytest.raises(WorkerStartError) as caught:
        worker.start({"op": "load"}, timeout_s=60)
    message = str(caught.value)
    assert message.startswith("env worker failed to start: exited with status 1")
    assert "its stderr ends:" in message
    assert message.rstrip().endswith("TypeError: unsupported operand type(s) for <<: 'str' and 'int'")
    assert not worker.alive()

