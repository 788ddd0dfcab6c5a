"""The page port's Linux adapter (``bmoe.stream.pages.PageMover``): mremap(2) through libc.

``move`` is three calls: ``mremap(src, src_len, dst_len, MAYMOVE | FIXED, dst)`` carries the page
table entries over (the destination's old mapping is dropped first, the source range is left
unmapped); an anonymous ``MAP_FIXED | MAP_NORESERVE`` mapping fills the hole at ``src`` again, so
nothing else can be mapped into the cache's buffer; ``madvise(MADV_NOHUGEPAGE)`` keeps that filler
on 4 KiB pages like the rest of the buffer (the cache releases and counts pages exactly; a kernel
without transparent huge pages refuses it, which changes nothing).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys

_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
_MAP_FIXED, _MAP_NORESERVE = 0x10, 0x4000
_MADV_NOHUGEPAGE = 15
_MAP_FAILED = ctypes.c_void_p(-1).value


class LibcPageMover:
    """Moves pages between page-aligned ranges of the cache's anonymous buffers (Linux only)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._mremap = libc.mremap
        self._mremap.restype = ctypes.c_void_p
        self._mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        self._mmap = libc.mmap
        self._mmap.restype = ctypes.c_void_p
        self._mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        self._madvise = libc.madvise
        self._madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._madvise.restype = ctypes.c_int

    @staticmethod
    def available() -> "LibcPageMover | None":
        """The adapter where the kernel has mremap with MREMAP_FIXED (Linux), else None."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return LibcPageMover()
        except (OSError, AttributeError):
            return None

    def move(self, src: int, src_len: int, dst: int, dst_len: int) -> None:
        got = self._mremap(src, src_len, dst_len, _MREMAP_MAYMOVE | _MREMAP_FIXED, dst)
        if got != dst:
            raise self._error("mremap", src, src_len)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | _MAP_NORESERVE
        if self._mmap(src, src_len, prot, flags, -1, 0) != src:
            raise self._error("mmap", src, src_len)
        self._madvise(src, src_len, _MADV_NOHUGEPAGE)  # best effort: EINVAL where the kernel has no THP

    @staticmethod
    def _error(call: str, addr: int, n: int) -> OSError:
        err = ctypes.get_errno()
        return OSError(err, f"{call} of {n} bytes at {addr:#x} failed: {os.strerror(err)}")
