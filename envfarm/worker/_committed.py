"""A lease's committed state, kept by the front where its worker cannot rewrite it.

After each call that changed a lease's database, the worker ships the pages that changed with
the call's answer; the front patches its copy (``CommittedState``). The copy is the lease's
database as of its last completed call: verification and snapshots read it, and when the
worker dies or is killed the lease continues on a fresh worker from it (``docs/tenancy.md``).
Pages the lease never wrote stay shared with the env's template, so a lease that only reads
costs a reference, one that writes a few rows a few pages.
"""

from __future__ import annotations

from envfarm.worker._frames import FrameError, decode_delta, page_size


class Template:
    """An env's initial database, split into pages every lease's copy starts from."""

    __slots__ = ("data", "size", "pages")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = page_size(data)
        self.pages = tuple(data[i:i + self.size] for i in range(0, len(data), self.size))


class CommittedState:
    """One lease's database as of its last completed call (pages; shared with the template
    until written)."""

    __slots__ = ("template", "pages", "size", "own")

    def __init__(self, template: Template) -> None:
        self.template = template
        self.pages: list[bytes] | None = None  # None: the template, untouched
        self.size = template.size
        #: Bytes of pages this lease wrote (not shared with the template): what it costs.
        self.own = 0

    def reset(self) -> None:
        self.pages, self.size, self.own = None, self.template.size, 0

    def copy(self) -> CommittedState:
        """Another lease's state now (a fork): the page list copied, the pages shared."""
        twin = CommittedState(self.template)
        twin.pages = None if self.pages is None else list(self.pages)
        twin.size, twin.own = self.size, self.own
        return twin

    def load(self, image: bytes) -> None:
        """Take a whole database image (a fork through the front); pages equal to the
        template's stay shared with it."""
        size = page_size(image)
        shared = self.template.pages if size == self.template.size else ()
        pages = [image[i:i + size] for i in range(0, len(image), size)]
        self.pages = [shared[k] if k < len(shared) and shared[k] == page else page
                      for k, page in enumerate(pages)]
        self.size, self.own = size, self._own_bytes()

    def apply(self, delta: bytes | memoryview) -> int:
        """Patch in a worker's delta (FrameError if malformed); returns the change in ``own``."""
        pages = self.pages if self.pages is not None else list(self.template.pages)
        total, size, changed = decode_delta(delta, len(pages), self.size)
        if size != self.size:
            pages = []
        del pages[total // size:]
        for number, page in changed:
            if number < len(pages):
                pages[number] = page
            elif number == len(pages):
                pages.append(page)
            else:  # decode_delta checked every new page is there, in order
                raise FrameError("state delta skips a page")
        self.pages, self.size = pages, size
        before, self.own = self.own, self._own_bytes()
        return self.own - before

    def _own_bytes(self) -> int:
        shared = self.template.pages if self.size == self.template.size else ()
        return self.size * sum(i >= len(shared) or page is not shared[i]
                               for i, page in enumerate(self.pages or ()))

    def image(self) -> bytes:
        """The database's bytes (what ``serialize`` gave in the worker after the call)."""
        return self.template.data if self.pages is None else b"".join(self.pages)
