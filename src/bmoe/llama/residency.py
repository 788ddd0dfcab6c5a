"""How much of some file ranges sits in RAM (the page cache), via mincore(2) on our own mapping.

llama.cpp maps the same files; page-cache pages are shared between mappings, so what our
read-only, never-touched mapping reports resident is what the model's weights have in RAM.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np

from bmoe.llama.libc import libc as _libc

PAGE = mmap.PAGESIZE


class PageResidency:
    def __init__(self, files: list[tuple[Path, list[tuple[int, int]]]]) -> None:
        """``files``: each file with the byte ranges [a, b) to watch."""
        self._maps: list[tuple[mmap.mmap, int, list[tuple[int, int]]]] = []
        self._vecs: list[np.ndarray] = []  # one mincore result vector per range, reused
        self.n_pages = 0
        for path, ranges in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            base = int(np.frombuffer(mm, dtype=np.uint8).ctypes.data)
            pages = [(a // PAGE * PAGE, -(-b // PAGE) * PAGE) for a, b in ranges if b > a]
            self.n_pages += sum((b - a) // PAGE for a, b in pages)
            self._maps.append((mm, base, pages))
            self._vecs.extend(np.empty((b - a) // PAGE, dtype=np.uint8) for a, b in pages)

    def fraction(self) -> float:
        """Resident share of the watched pages, 0..1 (1 when nothing is watched)."""
        if self.n_pages == 0:
            return 1.0
        resident = 0
        vecs = iter(self._vecs)
        for _mm, base, pages in self._maps:
            for a, b in pages:
                vec = next(vecs)
                if _libc.mincore(base + a, b - a, vec.ctypes.data) != 0:
                    raise OSError(ctypes.get_errno(), "mincore failed")
                resident += int(np.count_nonzero(vec & 1))
        return resident / self.n_pages

    def close(self) -> None:
        for mm, _base, _pages in self._maps:
            mm.close()
        self._maps = []
