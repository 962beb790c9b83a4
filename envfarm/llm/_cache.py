"""On-disk response cache and the replay file, both keyed by the exact request."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

from envfarm.errors import LLMError
from envfarm.llm._types import Recorded


class ResponseCache:
    """One JSON file per request key under ``root/<2 hex>/<key>.json``; writes are atomic renames."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> Recorded | None:
        """The cached record, or None (a corrupt entry counts as a miss)."""
        path = self._path(key)
        try:
            return Recorded.model_validate_json(path.read_text())
        except (OSError, ValueError):
            return None

    def put(self, record: Recorded) -> None:
        """Store a record; a crash mid-write leaves either the old entry or none."""
        path = self._path(record.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(record.model_dump_json())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class ReplayFile:
    """A JSONL recording of request/response pairs: served offline, appended to when recording."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._records: dict[str, Recorded] = {}
        if self.path.exists():
            data = self.path.read_bytes()
            if data and not data.endswith(b"\n"):
                # A recorder killed mid-line: cut the torn tail so later appends start clean.
                with open(self.path, "r+b") as fh:
                    fh.truncate(data.rfind(b"\n") + 1)
            lines = self.path.read_text().splitlines()
            for lineno, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    rec = Recorded.model_validate_json(line)
                except ValueError as exc:
                    raise LLMError(f"replay file {self.path}:{lineno} is not a recording line: {exc}") from exc
                self._records[rec.key] = rec

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: str) -> Recorded | None:
        """The recorded response of a request, or None."""
        return self._records.get(key)

    def append(self, record: Recorded) -> None:
        """Append one record as one line (single write, flushed) and remember it."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps(record.model_dump(mode="json"), ensure_ascii=False) + "\n"
            with open(self.path, "a") as fh:
                fh.write(line)
                fh.flush()
            self._records[record.key] = record
