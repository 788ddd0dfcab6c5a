"""The page port: moving an evicted expert's physical pages to the expert that replaces it
(docs/streaming.md, "The cache").

With page moves every expert has a fixed place in its tensor's buffer, so an incoming expert cannot
be read into the memory a victim leaves. Releasing and refaulting costs the kernel about ten times
what copying does; ``move`` instead remaps the whole pages inside the victim's slice onto the
incoming slice, and only the two partial pages at the ends are released. The Linux adapter is
``bmoe.llama.mremap_mover`` (this package imports no ctypes); without a mover the cache releases
and refaults, and holds the same.
"""

from __future__ import annotations

from typing import Protocol


class PageMover(Protocol):
    def move(self, src: int, src_len: int, dst: int, dst_len: int) -> None:
        """Move the pages of ``[src, src + src_len)`` to ``[dst, dst + dst_len)`` (page-aligned
        addresses and lengths inside the cache's own mappings). Afterwards ``dst`` holds the
        pages ``src`` held (cut to ``dst_len``, or followed by uncommitted pages up to it) and
        ``src`` is reserved, uncommitted, readable and writable memory again. Raises OSError."""
        ...
