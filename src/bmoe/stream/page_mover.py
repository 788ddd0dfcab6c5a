"""The page port: moving an evicted expert's physical pages to the expert that replaces it.

With the cache on, every expert has a fixed place in its tensor's buffer (the ggml tensor is one
stacked array, expert ``e`` at ``e * slice_nbytes``), so an incoming expert cannot simply be read
into the memory an evicted one leaves. Releasing the victim's pages (``MADV_DONTNEED``) and letting
the incoming read fault fresh ones in costs the kernel a free, an allocation and a zeroing per 4 KiB
page: about ten times what copying the bytes costs, and on the read lanes' time (the cache-on runs
read at 1.0-1.3 GB/s against 1.6-1.8 with the cache off, docs/benchmarks.md).

A ``PageMover`` instead hands the victim's pages over: ``move`` remaps the whole pages inside the
victim's slice to the whole pages inside the incoming expert's slice (Linux ``mremap``: page table
entries move, page contents and frames stay), and leaves the victim's range reserved but
uncommitted. Only the two partial pages at a slice's ends (shared with its neighbours in the
tensor) are still released and faulted the old way.

This package imports no ctypes (layer contract): the adapter lives in ``bmoe.llama.mremap_mover`` and the
runtime hands it to the streamer. Without one (tests that drive the cache alone, a platform
without ``mremap``) the cache releases and refaults as before; what it holds is the same.
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
