"""Imports that keep working after a process switches to a uid that cannot reach them.

The Python installation may sit where only root can look: pyenv under ``/root`` (mode 700), here
and in CI. A process that gives up root keeps what it imported but could import nothing new, and
env code imports lazily inside its handlers (``import uuid`` in a tool). So, before the switch,
``pin`` opens each import folder (``O_PATH``) and points imports at ``/proc/self/fd/N/...``: the
kernel resolves the rest of such a path from the open folder, as ``openat`` does, without
searching its ancestors again. Below the folder the usual checks apply (world-readable, as an
installation is), Landlock checks the real path, and the loader's ``dlopen`` of a C extension
takes the same path. Modules imported later have ``__file__`` under ``/proc/self/fd``.

``sys.path`` is rewritten to the pinned paths (so ``importlib.metadata`` finds distributions
too); a path hook maps the ``__path__`` of packages imported before (``email``, ``sqlalchemy``)
so their submodules load as well.
"""

from __future__ import annotations

import os
import sys
from importlib import machinery

_PROC_FD = "/proc/self/fd/"


def _folder(path) -> str | None:
    """The real folder an import path names, if it is one worth pinning."""
    if not isinstance(path, str) or not os.path.isabs(path) or path.startswith(_PROC_FD):
        return None
    real = os.path.realpath(path)
    return real if real != "/" and os.path.isdir(real) else None


class _Pins:
    """Pinned folders (real path -> fd) and the ``/proc/self/fd`` path of anything below one."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def add(self, folder: str) -> None:
        if self.under(folder) is None:
            self.fds[folder] = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def under(self, real: str) -> str | None:
        best = max((root for root in self.fds if real == root or real.startswith(root + "/")),
                   key=len, default=None)
        return None if best is None else f"{_PROC_FD}{self.fds[best]}{real[len(best):]}"


def _package_paths() -> list[str]:
    paths = []
    for module in list(sys.modules.values()):
        try:
            paths.extend(p for p in getattr(module, "__path__", None) or () if isinstance(p, str))
        except Exception:  # noqa: BLE001 - a module whose __path__ is no list of folders
            continue
    return paths


def _path_hook(pinned: dict[str, str]):
    loaders = [(machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
               (machinery.SourceFileLoader, machinery.SOURCE_SUFFIXES),
               (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES)]

    def pinned_folder(path: str):
        target = pinned.get(path)
        if target is None:
            raise ImportError("not a pinned folder", path=path)
        return machinery.FileFinder(target, *loaders)

    return pinned_folder


def pin() -> list[int]:
    """Make imports go through descriptors opened now (while this process can reach every import
    folder); returns the descriptors, which must stay open."""
    pins = _Pins()
    entries = [(p, _folder(p)) for p in sys.path]
    # Outer folders first, so a folder inside another (lib-dynload) reuses its descriptor.
    for real in sorted({r for _, r in entries if r}, key=len):
        pins.add(real)
    packages = {p: _folder(p) for p in _package_paths()}
    for real in sorted({r for r in packages.values() if r}, key=len):
        pins.add(real)  # an editable install outside sys.path
    sys.path[:] = [(pins.under(real) if real else None) or p for p, real in entries]
    pinned = {p: pins.under(real) for p, real in packages.items() if real}
    sys.path_hooks.insert(0, _path_hook(pinned))
    sys.path_importer_cache.clear()
    return list(pins.fds.values())
