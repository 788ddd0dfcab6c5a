"""Read byte ranges of the GGUF shards straight into destination memory, over parallel lanes.

``os.preadv`` releases the GIL, so N threads keep N reads in flight. O_DIRECT (the default)
bypasses the page cache: a streamed expert is copied once, into the buffer the matmul reads,
and never doubles as page cache the kernel must later evict. O_DIRECT needs offset, length and
address aligned to ALIGN. Destinations are *windows*: memory laid out like the file (same
offset modulo ALIGN), in which the reader may also write the file's own neighbouring bytes at
their own positions. When the aligned range fits the window it is read in place; otherwise the
unaligned head/tail go through a per-lane aligned bounce buffer. Either way only file bytes at
their file positions are ever written.
"""
from __future__ import annotations

import errno
import mmap
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .layout import FileId

ALIGN = max(4096, mmap.PAGESIZE)
_BOUNCE_BYTES = 1 << 20


class StreamIOError(RuntimeError):
    """Reading experts failed. Sticky: the session cannot stream any more and must be reopened."""


class FileChangedError(StreamIOError):
    """A GGUF shard changed (size, mtime or inode) while a session streams from it."""


@dataclass(frozen=True, slots=True, eq=False)
class Window:
    """Writable memory that mirrors a file region; ``addr`` is the address of ``view[0]``."""
    view: memoryview
    addr: int

    @staticmethod
    def over(buf: object) -> "Window":
        view = memoryview(buf).cast("B")
        return Window(view, int(np.frombuffer(view, np.uint8).ctypes.data) if len(view) else 0)


@dataclass(frozen=True, slots=True)
class ReadOp:
    file_index: int
    offset: int      # absolute offset in the shard
    nbytes: int
    window: Window
    at: int          # file byte ``offset`` lands at ``window.view[at]``


@dataclass(frozen=True, slots=True)
class ReaderStats:
    read_bytes: int     # bytes asked for (sum of ReadOp.nbytes): what the model needed
    device_bytes: int   # bytes the kernel was asked to read, alignment overhead included
    n_syscalls: int
    io_s: float         # wall time spent inside read()


def stderr_warn(msg: str) -> None:
    print(msg, file=sys.stderr)


def _merge(ops: Sequence[ReadOp]) -> list[ReadOp]:
    """Coalesce ops adjacent in file and window (e.g. experts 3 and 4 of one tensor)."""
    out: list[ReadOp] = []
    for op in sorted(ops, key=lambda o: (o.file_index, o.offset)):
        if op.nbytes <= 0:
            continue
        if out:
            last = out[-1]
            if (last.file_index == op.file_index and last.window is op.window
                    and last.offset + last.nbytes == op.offset and last.at + last.nbytes == op.at):
                out[-1] = ReadOp(last.file_index, last.offset, last.nbytes + op.nbytes, last.window, last.at)
                continue
        out.append(op)
    return out


class ExpertReader:
    def __init__(self, files: Sequence[FileId], *, odirect: bool = True, io_threads: int = 4,
                 chunk_bytes: int = 1 << 20, warn: Callable[[str], None] = stderr_warn) -> None:
        if io_threads < 1:
            raise ValueError(f"io_threads must be >= 1, got {io_threads}")
        self.files = tuple(files)
        self.io_threads = io_threads
        self.chunk_bytes = max(ALIGN, chunk_bytes - chunk_bytes % ALIGN)
        self._warn = warn
        self._lock = threading.Lock()
        self._local = threading.local()
        self._error: StreamIOError | None = None
        self._read_bytes = self._device_bytes = self._n_syscalls = 0
        self._io_s = 0.0
        self.odirect = False
        self._fds: list[int] = []
        self._retired: list[int] = []
        self.verify_files()
        if odirect:
            try:
                self._fds = [os.open(f.path, os.O_RDONLY | os.O_DIRECT) for f in self.files]
                self.odirect = True
            except OSError as exc:
                self._close_fds()
                self._warn(f"bmoe: O_DIRECT refused by the filesystem of {self.files[0].path} ({exc.strerror}); "
                           "reading experts through the page cache")
        if not self._fds:
            self._fds = [os.open(f.path, os.O_RDONLY) for f in self.files]
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="bmoe-io") if io_threads > 1 else None

    # --- public -------------------------------------------------------------------------
    def read(self, ops: Sequence[ReadOp]) -> None:
        """Fill every op's bytes; raises the sticky StreamIOError on any failure."""
        self.raise_if_failed()
        t0 = time.perf_counter()
        chunks = [c for op in _merge(ops) for c in self._split(op)]
        try:
            if self._pool is None or len(chunks) == 1:
                for c in chunks:
                    self._read_one(c)
            else:
                for fut in [self._pool.submit(self._read_one, c) for c in chunks]:
                    fut.result()
        except StreamIOError as exc:
            self.fail(exc)
        except OSError as exc:  # anything the lanes did not translate
            self.fail(StreamIOError(f"reading experts failed: {exc}"))
        finally:
            self._io_s += time.perf_counter() - t0
        self._read_bytes += sum(op.nbytes for op in ops)

    def verify_files(self) -> None:
        """Raise FileChangedError (sticky) if a shard's size, mtime or inode changed."""
        self.raise_if_failed()
        for f in self.files:
            try:
                now = FileId.of(f.path)
            except OSError as exc:
                self.fail(FileChangedError(f"model file {f.path} vanished while streaming ({exc.strerror}); "
                                            "reopen the session"))
            if now != f:
                self.fail(FileChangedError(f"model file {f.path} changed while streaming (size/mtime/inode differ "
                                            "from when it was opened); reopen the session"))

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    @property
    def error(self) -> StreamIOError | None:
        return self._error

    def stats(self) -> ReaderStats:
        with self._lock:
            return ReaderStats(self._read_bytes, self._device_bytes, self._n_syscalls, self._io_s)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._close_fds()

    # --- internals ----------------------------------------------------------------------
    def fail(self, exc: StreamIOError) -> None:
        """Record ``exc`` as the sticky error (the first one wins) and raise it."""
        if self._error is None:
            self._error = exc
        raise self._error

    def _close_fds(self) -> None:
        for fd in self._fds + self._retired:
            os.close(fd)
        self._fds, self._retired = [], []

    def _split(self, op: ReadOp) -> list[ReadOp]:
        """Cut at ALIGN-aligned file offsets so in-place O_DIRECT chunks stay aligned."""
        if op.nbytes <= self.chunk_bytes:
            return [op]
        out, off, end = [], op.offset, op.offset + op.nbytes
        while off < end:
            nxt = min(end, (off // self.chunk_bytes + 1) * self.chunk_bytes)
            out.append(ReadOp(op.file_index, off, nxt - off, op.window, op.at + (off - op.offset)))
            off = nxt
        return out

    def _count(self, nbytes: int) -> None:
        with self._lock:
            self._device_bytes += nbytes
            self._n_syscalls += 1

    def _pread_exact(self, fd: int, buf: memoryview, offset: int, need: int, op: ReadOp) -> None:
        """Read into ``buf`` from ``offset`` until at least ``need`` bytes arrived (EOF may cut the rest)."""
        got = 0
        while got < need:
            try:
                n = os.preadv(fd, [buf[got:]], offset + got)
            except OSError as exc:
                path = self.files[op.file_index].path
                raise StreamIOError(f"reading {path} at offset {offset + got} failed: {exc.strerror or exc}; "
                                    "streaming stopped for this session") from exc
            self._count(len(buf) - got)
            if n == 0:
                path = self.files[op.file_index].path
                raise StreamIOError(f"{path} ended at offset {offset + got}, before the expert bytes at "
                                    f"{op.offset}+{op.nbytes}: truncated or replaced file; reopen the session")
            got += n

    def _read_one(self, op: ReadOp) -> None:
        fd = self._fds[op.file_index]
        if not self.odirect:
            self._pread_exact(fd, op.window.view[op.at:op.at + op.nbytes], op.offset, op.nbytes, op)
            return
        try:
            self._read_direct(fd, op)
        except StreamIOError as exc:
            if not (isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EINVAL):
                raise
            self._fallback_buffered()
            self._read_one(op)

    def _fallback_buffered(self) -> None:
        # Some filesystems accept O_DIRECT at open and refuse it at read time.
        with self._lock:
            if not self.odirect:
                return
            # Other lanes may still be inside preadv on the old fds: retire them, close at close().
            self._retired += self._fds
            self._fds = [os.open(f.path, os.O_RDONLY) for f in self.files]
            self.odirect = False
        self._warn(f"bmoe: O_DIRECT reads refused on {self.files[0].path}; reading experts through the page cache")

    def _read_direct(self, fd: int, op: ReadOp) -> None:
        lo = op.offset - op.offset % ALIGN
        hi = -(-(op.offset + op.nbytes) // ALIGN) * ALIGN
        w_lo = op.at - (op.offset - lo)
        w_hi = w_lo + (hi - lo)
        if 0 <= w_lo and w_hi <= len(op.window.view) and (op.window.addr + w_lo) % ALIGN == 0:
            # In place: the extra head/tail bytes are the file's own, at their own positions.
            self._pread_exact(fd, op.window.view[w_lo:w_hi], lo, op.offset + op.nbytes - lo, op)
            return
        bounce = self._bounce()
        done = 0
        while done < op.nbytes:
            off = op.offset + done
            blk = off - off % ALIGN
            take = min(op.nbytes - done, len(bounce) - (off - blk))
            span = -(-(off - blk + take) // ALIGN) * ALIGN
            self._pread_exact(fd, bounce[:span], blk, off - blk + take, op)
            op.window.view[op.at + done:op.at + done + take] = bounce[off - blk:off - blk + take]
            done += take

    def _bounce(self) -> memoryview:
        buf = getattr(self._local, "bounce", None)
        if buf is None:
            self._local.mm = mmap.mmap(-1, _BOUNCE_BYTES)  # anonymous maps are page aligned
            buf = self._local.bounce = memoryview(self._local.mm)
        return buf
