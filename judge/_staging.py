"""Read-only staging of the databases a verifier reads (a folder workers can read, not write)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
from collections import OrderedDict
from urllib.parse import quote

DbInput = str | os.PathLike[str] | bytes


class Stager:
    """Read-only copies of the databases, in a folder the workers can read but not write.

    Bytes staged with ``keep=True`` (an initial snapshot: the env's template, the same object
    for every verification of that env) are kept by identity (an LRU); other bytes (a final
    snapshot, new each time) are written for one call and removed after it: writing them costs
    less than hashing them to look for a copy would (there is none). Path inputs are kept while
    the file is unchanged (inode, size, mtime), and copied per call when a -wal file says its
    content is not all in the file.
    """

    def __init__(self, keep: int = 64) -> None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.dir = tempfile.mkdtemp(prefix="envfarm-verifier-", dir=base)
        os.chmod(self.dir, 0o711)  # workers (maybe uid nobody) may open known names, not list
        self._keep = keep
        self._cached: OrderedDict[object, str] = OrderedDict()  # key -> staged path
        self._refs: dict[object, bytes] = {}  # identity key -> the bytes (keeps its id unique)
        self._pins: dict[str, int] = {}
        self._lock = threading.Lock()
        self._seq = 0

    def _name(self) -> str:
        with self._lock:
            self._seq += 1
            return os.path.join(self.dir, f"c{self._seq}-{os.urandom(4).hex()}.db")

    def stage(self, db: DbInput, keep: bool = False) -> tuple[str, bool]:
        """Return (path, is_cached). Raise ValueError on input that is no database."""
        if isinstance(db, (bytes, bytearray, memoryview)):
            return self._stage_bytes(db, keep and isinstance(db, bytes))
        return self._stage_path(db)

    def _stage_bytes(self, data: bytes | bytearray | memoryview, keep: bool) -> tuple[str, bool]:
        key = ("id", id(data))
        if keep:
            with self._lock:
                if self._refs.get(key) is data:
                    return self._hit(key), True
        path = self._name()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        if not keep:
            return path, False
        with self._lock:
            if self._refs.get(key) is data:  # another thread staged it meanwhile
                _unlink(path)
                return self._hit(key), True
            self._refs[key] = data  # type: ignore[assignment]  # bytes when kept
            self._add(key, path)
        return path, True

    def _stage_path(self, db: str | os.PathLike[str]) -> tuple[str, bool]:
        src = os.fspath(db)
        if not os.path.isfile(src):
            raise ValueError(f"no database file at {src!r}")
        if os.path.exists(src + "-wal"):
            return self._backup(src), False
        # An unchanged file (same inode, size and mtime) is staged once.
        st = os.stat(src)
        key = f"p{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}"
        with self._lock:
            if key in self._cached:
                return self._hit(key), True
        tmp = self._name()
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o444)
        if os.stat(src).st_mtime_ns != st.st_mtime_ns:
            return tmp, False  # it changed while we copied: use this copy once
        path = os.path.join(self.dir, f"{key}.db")
        with self._lock:
            if key in self._cached:  # another call staged it meanwhile: never replace a
                _unlink(tmp)         # staged file (a verifier's Landlock rule holds its inode)
                return self._hit(key), True
            os.replace(tmp, path)
            self._add(key, path)
        return path, True

    def _backup(self, src: str) -> str:
        # Committed rows may still sit in the WAL; the backup API sees them, a copy would not.
        dst = self._name()
        with sqlite3.connect(f"file:{quote(src)}?mode=ro", uri=True) as s, \
                sqlite3.connect(dst) as d:
            s.backup(d)
            d.execute("PRAGMA journal_mode=DELETE")
        s.close()
        d.close()
        os.chmod(dst, 0o444)
        return dst

    def _hit(self, key: object) -> str:
        """A kept copy, pinned for one more call (the lock held)."""
        self._cached.move_to_end(key)
        path = self._cached[key]
        self._pins[path] = self._pins.get(path, 0) + 1
        return path

    def _add(self, key: object, path: str) -> None:
        """Keep a new copy, pinned for its first call (the lock held)."""
        self._cached[key] = path
        self._pins[path] = self._pins.get(path, 0) + 1
        self._evict()

    def release(self, path: str, cached: bool) -> None:
        if not cached:
            _unlink(path)
            return
        with self._lock:
            left = self._pins.get(path, 1) - 1
            if left <= 0:
                self._pins.pop(path, None)
            else:
                self._pins[path] = left
            self._evict()

    def _evict(self) -> None:
        while len(self._cached) > self._keep:
            for key, path in self._cached.items():
                if path not in self._pins:
                    del self._cached[key]
                    self._refs.pop(key, None)
                    _unlink(path)
                    break
            else:
                return

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def ro_uri(path: str) -> str:
    return f"file:{quote(path)}?mode=ro&immutable=1"
