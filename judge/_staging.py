"""Read-only staging of the databases a verifier reads (a folder workers can read, not write)."""

from __future__ import annotations

import hashlib
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

    Byte inputs are content-addressed and kept (an LRU), since the same initial snapshot is
    verified again and again; path inputs are kept while the file is unchanged (inode, size,
    mtime), and copied per call when a -wal file says its content is not all in the file.
    """

    def __init__(self, keep: int = 64) -> None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.dir = tempfile.mkdtemp(prefix="envfarm-verifier-", dir=base)
        os.chmod(self.dir, 0o711)  # workers (maybe uid nobody) may open known names, not list
        self._keep = keep
        self._cached: OrderedDict[str, str] = OrderedDict()
        self._pins: dict[str, int] = {}
        self._by_identity: dict[int, tuple[bytes, str]] = {}
        self._lock = threading.Lock()
        self._seq = 0

    def _name(self) -> str:
        with self._lock:
            self._seq += 1
            return os.path.join(self.dir, f"c{self._seq}-{os.urandom(4).hex()}.db")

    def stage(self, db: DbInput) -> tuple[str, bool]:
        """Return (path, is_cached). Raise ValueError on input that is no database."""
        if isinstance(db, (bytes, bytearray, memoryview)):
            data = bytes(db)
            with self._lock:
                # The same bytes object again (a template snapshot, say): skip hashing it.
                known = self._by_identity.get(id(data))
            if known is not None and known[0] is data:
                key = known[1]
            else:
                key = hashlib.blake2b(data, digest_size=16).hexdigest()
                with self._lock:
                    self._by_identity[id(data)] = (data, key)  # the ref keeps id() unique
                    while len(self._by_identity) > self._keep:
                        self._by_identity.pop(next(iter(self._by_identity)))
            with self._lock:
                path = self._cached.get(key)
                if path is not None:
                    self._cached.move_to_end(key)
                    self._pins[path] = self._pins.get(path, 0) + 1
                    return path, True
            path = os.path.join(self.dir, f"b{key}.db")
            tmp = self._name()
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o444)
            os.replace(tmp, path)
            with self._lock:
                self._cached[key] = path
                self._pins[path] = self._pins.get(path, 0) + 1
                self._evict()
            return path, True
        src = os.fspath(db)
        if not os.path.isfile(src):
            raise ValueError(f"no database file at {src!r}")
        wal = os.path.exists(src + "-wal")
        if not wal:
            # An unchanged file (same inode, size and mtime) is staged once, like bytes are.
            st = os.stat(src)
            key = f"p{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}"
            with self._lock:
                path = self._cached.get(key)
                if path is not None:
                    self._cached.move_to_end(key)
                    self._pins[path] = self._pins.get(path, 0) + 1
                    return path, True
            tmp = self._name()
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o444)
            if os.stat(src).st_mtime_ns != st.st_mtime_ns:
                return tmp, False  # it changed while we copied: use this copy once
            path = os.path.join(self.dir, f"{key}.db")
            os.replace(tmp, path)
            with self._lock:
                self._cached[key] = path
                self._pins[path] = self._pins.get(path, 0) + 1
                self._evict()
            return path, True
        # Committed rows may still sit in the WAL; the backup API sees them, a copy would not.
        dst = self._name()
        with sqlite3.connect(f"file:{quote(src)}?mode=ro", uri=True) as s, \
                sqlite3.connect(dst) as d:
            s.backup(d)
            d.execute("PRAGMA journal_mode=DELETE")
        s.close()
        d.close()
        os.chmod(dst, 0o444)
        return dst, False

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
