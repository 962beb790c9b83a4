"""Workers started ahead of need, so a cold start pays only for loading the env's code.

A worker spends most of its start-up importing FastAPI, SQLAlchemy and the runtime and entering
the jail; only then does it learn which env it serves. A spare is a worker that has done all of
that (it holds no env's code yet) and waits for its ``load``: any type can take it. Taking one
spawns its replacement at once, so the next cold start finds one too.
"""

from __future__ import annotations

import threading
from typing import Any

from envfarm.worker._process import WorkerProcess


class SpareWorkers:
    """Up to ``count`` started, confined, env-less workers of one farm process."""

    def __init__(self, config: dict[str, Any], count: int, *, stderr: bool = False) -> None:
        self.config = config
        self.count = count
        self.stderr = stderr
        self._spares: list[WorkerProcess] = []
        self._lock = threading.Lock()
        self._closed = False
        self.refill()

    def _spawn(self) -> WorkerProcess:
        return WorkerProcess(self.config, stderr=self.stderr)

    def refill(self) -> None:
        with self._lock:
            self._spares = [w for w in self._spares if w.proc.poll() is None]
            while not self._closed and len(self._spares) < self.count:
                self._spares.append(self._spawn())

    def take(self) -> WorkerProcess:
        """A spare (oldest first, so it is the most likely to be ready), or a new worker."""
        with self._lock:
            while self._spares:
                worker = self._spares.pop(0)
                if worker.proc.poll() is None:
                    break
                worker.kill("spare exited while waiting")
            else:
                worker = None
        self.refill()  # its replacement starts importing now
        return worker if worker is not None else self._spawn()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
        for worker in spares:
            worker.kill("farm shut down")
