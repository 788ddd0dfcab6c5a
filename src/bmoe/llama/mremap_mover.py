"""The page port's Linux adapter (``bmoe.stream.page_mover.PageMover``): mremap(2) through libc.

Where the two ranges are the same length (the usual case: one tensor's slices all have interiors
of the same number of pages), ``move`` is one call: ``mremap(src, n, n, MAYMOVE | FIXED |
DONTUNMAP, dst)`` carries the page table entries over (the destination's old mapping is dropped
first) and leaves the source range mapped as it was, with its flags (``MADV_NOHUGEPAGE``
included), but empty: touching it faults in fresh zero pages, as for memory never written.

Otherwise, or on a kernel that refuses ``MREMAP_DONTUNMAP`` (before Linux 5.7, or 5.13 for the
flags the cache's buffers have), it is three calls: ``mremap(src, src_len, dst_len, MAYMOVE |
FIXED, dst)`` moves and resizes (the source range is left unmapped); an anonymous ``MAP_FIXED |
MAP_NORESERVE`` mapping fills the hole at ``src`` again, so nothing else can be mapped into the
cache's buffer; ``madvise(MADV_NOHUGEPAGE)`` keeps that filler on 4 KiB pages like the rest of the
buffer (the cache releases and counts pages exactly; a kernel without transparent huge pages
refuses it, which changes nothing). A resizing move must not use ``DONTUNMAP``: the destination
would keep a tail of its old mapping, and a later move of that range would span two mappings,
which mremap refuses.

The one-call move costs mappings: a range moved in stays a mapping of its own, so the buffers
end up split at about every slice, two mappings per expert slice (12,400 on the 16-layer bench
model, against 2,100 with the filler, which merges with its neighbours). The kernel caps a
process's mappings (``vm.max_map_count``, 65,530 by default), so ``available`` turns the one-call
move on only where twice the model's expert slices, plus room for everything else, fit under
that cap (Qwen3-30B-A3B's 18,432 slices do; a 94-layer model's 36,096 do not); a refusal for lack
of mappings (ENOMEM) turns it off as well.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import sys
from pathlib import Path

from bmoe.llama.libc import (
    MADV_NOHUGEPAGE,
    MAP_FIXED,
    MAP_NORESERVE,
    MREMAP_DONTUNMAP,
    MREMAP_FIXED,
    MREMAP_MAYMOVE,
    errno_error,
    libc,
)


class LibcPageMover:
    """Moves pages between page-aligned ranges of the cache's anonymous buffers (Linux only).
    ``dontunmap=False`` never tries the one-call move (tests run both ways)."""

    def __init__(self, *, dontunmap: bool = True) -> None:
        self.dontunmap = dontunmap  # turned off for good the first time the kernel refuses it

    @staticmethod
    def available(n_slices: int = 0) -> "LibcPageMover | None":
        """The adapter where the kernel has mremap with MREMAP_FIXED (Linux), else None; with the
        one-call move where the cache's ``n_slices`` expert slices leave room under the cap on
        mappings (see the module)."""
        if not sys.platform.startswith("linux"):
            return None
        return LibcPageMover(dontunmap=2 * n_slices + _OTHER_MAPPINGS <= _max_map_count())

    def move(self, src: int, src_len: int, dst: int, dst_len: int) -> None:
        if self.dontunmap and src_len == dst_len:
            if libc.mremap(src, src_len, dst_len, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, dst) == dst:
                return
            if ctypes.get_errno() not in (errno.EINVAL, errno.ENOMEM):
                raise errno_error("mremap", src, src_len)
            self.dontunmap = False  # an older kernel, or out of mappings: the three-call move, from now on
        if libc.mremap(src, src_len, dst_len, MREMAP_MAYMOVE | MREMAP_FIXED, dst) != dst:
            raise errno_error("mremap", src, src_len)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE
        if libc.mmap(src, src_len, prot, flags, -1, 0) != src:
            raise errno_error("mmap", src, src_len)
        libc.madvise(src, src_len, MADV_NOHUGEPAGE)  # best effort: EINVAL where the kernel has no THP


_OTHER_MAPPINGS = 4096  # room left under the cap for llama.cpp, Python, libraries and the dense weights


def _max_map_count() -> int:
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530  # the kernel's default
