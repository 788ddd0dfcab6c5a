"""Dense weights in anonymous memory (``--dense-weights anon``): why and what it costs are in
docs/streaming.md, "Dense weights in anonymous memory".

For each dense range of llama.cpp's file mapping, the bytes are copied into a fresh anonymous
mapping that ``mremap(MREMAP_FIXED)`` moves over the range, at the same addresses: no ggml tensor
is rebound, and llama.cpp's own ``munmap`` frees the pages. The mapping is found in
``/proc/self/maps`` by the inode the file had before the load (``file_ids``), not by its path: a
dense twin may be unlinked meanwhile and its mapping still keeps it readable.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from bmoe.errors import BmoeError
from bmoe.llama.libc import MAP_FAILED, MREMAP_FIXED, MREMAP_MAYMOVE
from bmoe.llama.libc import libc as _libc

PAGE = mmap.PAGESIZE


class DenseAnonError(BmoeError):
    """The dense weights could not be moved into anonymous memory (the session is not opened)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One file-backed line of /proc/self/maps: [start, end) maps the file from ``offset``."""

    start: int
    end: int
    offset: int
    dev: tuple[int, int]
    inode: int
    path: str


def file_segments(maps: str | None = None) -> frozenset[Segment]:
    """The process's file-backed mappings now (or those of ``maps``, a /proc/<pid>/maps text)."""
    if maps is None:
        with open("/proc/self/maps") as f:
            maps = f.read()
    out = set()
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or parts[4] == "0":
            continue  # anonymous (inode 0), or no path
        lo, hi = parts[0].split("-")
        major, minor = parts[3].split(":")
        out.add(
            Segment(
                int(lo, 16), int(hi, 16), int(parts[2], 16), (int(major, 16), int(minor, 16)), int(parts[4]), parts[5]
            )
        )
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class FileId:
    """The file a path named when it was looked at: its device, inode and resolved path."""

    st_dev: int
    inode: int
    path: str

    @property
    def dev(self) -> tuple[int, int]:
        return os.major(self.st_dev), os.minor(self.st_dev)


def file_id(path: Path) -> FileId:
    """What ``path`` is now (raises OSError when it cannot be stat'ed)."""
    st = os.stat(path)
    return FileId(st.st_dev, st.st_ino, os.path.realpath(path))


def file_ids(paths: Iterable[Path]) -> dict[Path, FileId]:
    """``file_id`` of each path that can be stat'ed: taken before llama.cpp maps them, so their
    mappings are found even if a path is removed while it loads."""
    out = {}
    for path in paths:
        try:
            out[path] = file_id(path)
        except OSError:
            pass  # llama.cpp will not load it either, and says so
    return out


def _of_file(segments: Iterable[Segment], fid: FileId) -> list[Segment]:
    """The segments that map the file ``fid`` (its inode, and its device or its resolved path:
    some file systems show another device number in the maps than stat gives; an unlinked file's
    path is followed by `` (deleted)``)."""
    names = (fid.path, fid.path + " (deleted)")
    return sorted(
        (s for s in segments if s.inode == fid.inode and (s.dev == fid.dev or s.path in names)), key=lambda s: s.start
    )


def _id_of(path: Path, ids: Mapping[Path, FileId] | None) -> FileId:
    """The id recorded for ``path`` before the load, else what it is now (OSError if gone)."""
    fid = ids.get(path) if ids else None
    return fid if fid is not None else file_id(path)


def regions(segments: Sequence[Segment], ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Addresses [lo, hi) of the byte ranges [a, b) of a file, widened to whole pages, where
    ``segments`` map them; merged, ascending. A part of a range no segment maps is left out
    (llama.cpp unmaps the header and whatever lies outside the tensors it uses)."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if b <= a:
            continue
        a, b = a // PAGE * PAGE, -(-b // PAGE) * PAGE
        for s in segments:
            lo, hi = max(a, s.offset), min(b, s.offset + (s.end - s.start))
            if hi > lo:
                out.append((s.start + lo - s.offset, s.start + hi - s.offset))
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(out):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _move_to_anon(lo: int, hi: int) -> None:
    """Replace the pages of [lo, hi) by anonymous read-only pages holding the same bytes."""
    n = hi - lo
    new = _libc.mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if new in (None, MAP_FAILED):
        raise OSError(ctypes.get_errno(), f"cannot allocate {n} bytes of anonymous memory")
    try:
        ctypes.memmove(new, lo, n)
        if _libc.mprotect(new, n, mmap.PROT_READ) != 0:  # as llama.cpp maps weights: read-only
            raise OSError(ctypes.get_errno(), "mprotect failed")
        moved = _libc.mremap(new, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, lo)
        if moved != lo:
            raise OSError(ctypes.get_errno(), "mremap failed")
    except BaseException:
        _libc.munmap(new, n)
        raise


class AnonDense:
    """The dense weights' pages moved into anonymous memory, and how much of them is in RAM."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self.spans = tuple(spans)
        self.nbytes = sum(hi - lo for lo, hi in spans)
        self._vecs = [np.empty((hi - lo) // PAGE, dtype=np.uint8) for lo, hi in spans]
        self._open = True

    @classmethod
    def move(
        cls,
        before: frozenset[Segment],
        files: Sequence[tuple[Path, Sequence[tuple[int, int]]]],
        ids: Mapping[Path, FileId] | None = None,
    ) -> "AnonDense":
        """Move the ``files``' byte ranges, in the mappings made since ``before``, into anonymous
        memory. Each file is found by its ``ids`` entry (``file_ids`` before the load), so one
        removed since is still moved: its pages are read through the mapping. Raises
        DenseAnonError when a file has no new mapping or a move fails."""
        new = file_segments() - before
        spans: list[tuple[int, int]] = []
        for path, ranges in files:
            try:
                segs = _of_file(new, _id_of(path, ids))
            except OSError:  # gone, and not looked at before the load: its mapping cannot be told
                segs = []
            if not segs:
                raise DenseAnonError(
                    f"dense_weights: anon: llama.cpp's mapping of {path} is not in /proc/self/maps; use mmap"
                )
            spans += regions(segs, ranges)
        for lo, hi in spans:
            try:
                _move_to_anon(lo, hi)
            except OSError as e:
                raise DenseAnonError(
                    f"dense_weights: anon: moving {hi - lo} bytes of dense weights into anonymous "
                    f"memory failed ({e.strerror or e}); use mmap"
                ) from None
        return cls(spans)

    def fraction(self) -> float:
        """Share of the pages in RAM (mincore), 0..1; 1 when nothing is held. Without swap it is 1."""
        if not self._open or not self.spans:
            return 1.0 if self._open else 0.0
        resident = total = 0
        for (lo, hi), vec in zip(self.spans, self._vecs):
            if _libc.mincore(lo, hi - lo, vec.ctypes.data) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            resident += int(np.count_nonzero(vec & 1))
            total += vec.size
        return resident / total

    def close(self) -> None:
        """Stop measuring. The pages themselves go with llama.cpp's mapping (llama_model_free)."""
        self._open = False


def inner_regions(segments: Sequence[Segment], ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Addresses [lo, hi) of the whole pages that lie inside the byte ranges [a, b) of a file, where
    ``segments`` map them (narrowed to whole pages: a page shared with a byte outside is left)."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        a, b = -(-a // PAGE) * PAGE, b // PAGE * PAGE
        for s in segments:
            lo, hi = max(a, s.offset), min(b, s.offset + (s.end - s.start))
            if hi > lo:
                out.append((s.start + lo - s.offset, s.start + hi - s.offset))
    return sorted(out)


def drop_unused(
    before: frozenset[Segment],
    files: Sequence[tuple[Path, Sequence[tuple[int, int]]]],
    ids: Mapping[Path, FileId] | None = None,
) -> int:
    """Give back the pages llama.cpp populated for byte ranges nobody reads (a streamed model's
    expert tensors, rebound onto the streamer's buffers): unmap them from the mappings made since
    ``before`` (``MADV_DONTNEED``) and drop them from the page cache (``POSIX_FADV_DONTNEED``).

    llama.cpp maps with ``MAP_POPULATE``; for a dense twin the expert ranges are holes, which that
    fills with zero pages: as many as the experts' bytes, counted in the process's RSS and its
    memory cgroup until the kernel reclaims them. Touching them again would only fault the same
    zeros back in. Returns the bytes unmapped. Best effort, never raises: a refusal leaves pages
    mapped, and a file that cannot be looked at (a twin removed meanwhile) is left as it is; an
    unlinked file's pages go when llama.cpp unmaps it. Files are found by ``ids`` as in ``move``."""
    dropped = 0
    try:
        new = file_segments() - before  # read once: dropping pages leaves the mappings as they are
    except OSError:
        return 0
    for path, ranges in files:
        try:
            fid = _id_of(path, ids)
        except OSError:
            continue
        for lo, hi in inner_regions(_of_file(new, fid), ranges):
            if _libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED) == 0:
                dropped += hi - lo
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (fid.st_dev, fid.inode):  # not another file put there since
                for a, b in ranges:
                    os.posix_fadvise(fd, a, b - a, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)
    return dropped
