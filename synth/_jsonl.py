"""Append-only JSONL files that survive ``kill -9``: one ``write`` per record, keyed, torn tails cut.

A record is appended with a single ``os.write`` on an ``O_APPEND`` descriptor, then fsync'd, so a
kill leaves either the whole line or a torn last line. Opening a file cuts a torn last line, and
``append_once`` refuses a key that is already there: a resumed run neither loses nor duplicates.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

KeyFn = Callable[[dict[str, Any]], Hashable]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a file (a torn last line is skipped); [] if it is missing."""
    if not Path(path).exists():
        return []
    out = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn line from a killed writer
    return out


class JsonlStore:
    """One JSONL output file with an in-memory index by key (last record of a key wins)."""

    def __init__(self, path: Path, key: KeyFn, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.key = key
        self.fsync = fsync
        self._lock = threading.Lock()
        self._records: dict[Hashable, dict[str, Any]] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        for rec in read_jsonl(self.path):
            self._records[self.key(rec)] = rec

    def _repair_tail(self) -> None:
        # Cut a partial last line so the next append starts on a fresh line.
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as fh:
                fh.truncate(cut)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(list(self._records.values()))

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The record of a key, or ``default``."""
        return self._records.get(key, default)

    def append_once(self, record: dict[str, Any]) -> bool:
        """Append unless the key is already stored; True when written."""
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        key = self.key(record)
        with self._lock:
            if key in self._records:
                return False
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            self._records[key] = record
        return True

    def replace(self, record: dict[str, Any]) -> None:
        """Replace (or add) the record of its key by rewriting the whole file atomically:
        write a temp file, fsync, ``os.replace``, fsync the folder. A kill leaves the old file
        or the new one, never a mix."""
        key = self.key(record)
        with self._lock:
            self._records[key] = record
            self._rewrite()

    def remove(self, key: Hashable) -> bool:
        """Drop the record of ``key`` (atomic whole-file rewrite, as ``replace``); True if it was there."""
        with self._lock:
            if self._records.pop(key, None) is None:
                return False
            self._rewrite()
        return True

    def _rewrite(self) -> None:
        data = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n"
                       for r in self._records.values()).encode()
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def by_scenario(rec: dict[str, Any]) -> Hashable:
    """Key of per-scenario files."""
    return rec["scenario"]


def by_task(rec: dict[str, Any]) -> Hashable:
    """Key of per-task files."""
    return (rec["scenario"], int(rec["task_idx"]))


def by_name(rec: dict[str, Any]) -> Hashable:
    """Key of gen_scenario.jsonl."""
    return rec["name"]
