"""The page port's Linux adapter (``bmoe.stream.pages.PageMover``): mremap(2) through libc.

``move`` is three calls: ``mremap(src, src_len, dst_len, MAYMOVE | FIXED, dst)`` carries the page
table entries over (the destination's old mapping is dropped first, the source range is left
unmapped); an anonymous ``MAP_FIXED | MAP_NORESERVE`` mapping fills the hole at ``src`` again, so
nothing else can be mapped into the cache's buffer; ``madvise(MADV_NOHUGEPAGE)`` keeps that filler
on 4 KiB pages like the rest of the buffer (the cache releases and counts pages exactly; a kernel
without transparent huge pages refuses it, which changes nothing).
"""
from __future__ import annotations

import mmap
import sys

from .libc import MADV_NOHUGEPAGE, MAP_FIXED, MAP_NORESERVE, MREMAP_FIXED, MREMAP_MAYMOVE, errno_error, libc


class LibcPageMover:
    """Moves pages between page-aligned ranges of the cache's anonymous buffers (Linux only)."""

    @staticmethod
    def available() -> "LibcPageMover | None":
        """The adapter where the kernel has mremap with MREMAP_FIXED (Linux), else None."""
        return LibcPageMover() if sys.platform.startswith("linux") else None

    def move(self, src: int, src_len: int, dst: int, dst_len: int) -> None:
        if libc.mremap(src, src_len, dst_len, MREMAP_MAYMOVE | MREMAP_FIXED, dst) != dst:
            raise errno_error("mremap", src, src_len)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE
        if libc.mmap(src, src_len, prot, flags, -1, 0) != src:
            raise errno_error("mmap", src, src_len)
        libc.madvise(src, src_len, MADV_NOHUGEPAGE)  # best effort: EINVAL where the kernel has no THP
