"""Read byte ranges of the GGUF shards straight into destination memory, over parallel lanes.

``os.preadv`` releases the GIL, so N lane threads keep N reads in flight. ``submit`` queues
groups of reads (in order: the lanes take chunks first in, first out) and returns a ``Batch``
at once; ``Batch.wait(i)`` blocks until group ``i`` is in place, so the caller can compute on
group 0 while later groups are still being read. ``read`` is submit-and-wait. O_DIRECT (the default)
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
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

import numpy as np

from bmoe.errors import EngineFailure
from bmoe.stream.content import CHECK_EVERY_S, COST_SHARE, ContentSample
from bmoe.stream.layout import FileId
from bmoe.stream.stats import StreamStats

ALIGN = max(4096, mmap.PAGESIZE)
_BOUNCE_BYTES = 1 << 20
_WAKE: Any = ("wake",)  # queued with each urgent read (see ExpertReader.submit)


class StreamIOError(EngineFailure):
    """Reading experts failed. Sticky: the session cannot stream any more and must be reopened."""


class FileChangedError(StreamIOError):
    """A GGUF shard changed (size, mtime or inode, or its sampled content) while a session streams from it."""


@dataclass(frozen=True, slots=True, eq=False)
class Window:
    """Writable memory that mirrors a file region; ``addr`` is the address of ``view[0]``."""

    view: memoryview
    addr: int

    @staticmethod
    def over(buf: Any) -> "Window":
        view = memoryview(buf).cast("B")
        return Window(view, int(np.frombuffer(view, np.uint8).ctypes.data) if len(view) else 0)


@dataclass(frozen=True, slots=True)
class ReadOp:
    file_index: int
    offset: int  # absolute offset in the shard
    nbytes: int
    window: Window
    at: int  # file byte ``offset`` lands at ``window.view[at]``


@dataclass(frozen=True, slots=True)
class _Fds:
    """The shards' fds and whether they were opened with O_DIRECT: one value, swapped whole by the
    fallback, so a lane takes both from one snapshot (an unaligned read on an O_DIRECT fd is EINVAL)."""

    fds: tuple[int, ...]
    odirect: bool


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
            if (
                last.file_index == op.file_index
                and last.window is op.window
                and last.offset + last.nbytes == op.offset
                and last.at + last.nbytes == op.at
            ):
                out[-1] = ReadOp(last.file_index, last.offset, last.nbytes + op.nbytes, last.window, last.at)
                continue
        out.append(op)
    return out


class ExpertReader:
    def __init__(
        self,
        files: Sequence[FileId],
        *,
        odirect: bool = True,
        io_threads: int = 4,
        chunk_bytes: int = 1 << 20,
        warn: Callable[[str], None] = stderr_warn,
    ) -> None:
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
        self._io_s = self._stall_s = 0.0
        self._io = _Fds((), False)  # read once per read (_read_one), replaced whole (_fallback_buffered)
        self._retired: list[int] = []
        self._content: ContentSample | None = None  # see watch_content
        self._content_due = 0.0
        self.content_checks = 0  # content checks done, and the seconds they took
        self.content_s = 0.0
        self.verify_files()
        if odirect:
            try:
                self._io = _Fds(self._open_all(os.O_RDONLY | os.O_DIRECT), True)
            except OSError as exc:
                self._warn(
                    f"bmoe: O_DIRECT refused by the filesystem of {self.files[0].path} ({exc.strerror}); "
                    "reading experts through the page cache"
                )
        if not self._io.fds:
            self._io = _Fds(self._open_all(os.O_RDONLY), False)
        self._queue: queue.SimpleQueue[tuple[Batch, int, ReadOp] | None] = queue.SimpleQueue()
        # Urgent reads: every item here has a _WAKE in _queue, so a lane blocked there wakes for it.
        self._urgent: queue.SimpleQueue[tuple[Batch, int, ReadOp]] = queue.SimpleQueue()
        self._covered = 0.0  # io_s counts the union of the batches' spans: where it ends so far
        self._lanes: list[threading.Thread] = []
        try:
            for i in range(io_threads):
                lane = threading.Thread(target=self._lane, name=f"bmoe-io-{i}", daemon=True)
                lane.start()
                self._lanes.append(lane)
        except BaseException as exc:
            started = len(self._lanes)
            self.close()  # nothing is queued: the lanes started stop at once, and the files close
            if isinstance(exc, RuntimeError):  # Thread.start: the process may start no more threads
                raise OSError(
                    errno.EAGAIN, f"cannot start read lane {started + 1} of {io_threads} ({exc}); try fewer io_threads"
                ) from exc
            raise

    # --- public -------------------------------------------------------------------------
    def read(self, ops: Sequence[ReadOp]) -> None:
        """Fill every op's bytes; raises the sticky StreamIOError on any failure."""
        self.submit([ops]).wait_all()

    def submit(self, groups: Sequence[Sequence[ReadOp]], *, urgent: Collection[int] = ()) -> "Batch":
        """Queue every group's reads, group 0 first, and return without waiting.

        Groups named in ``urgent`` go ahead of everything already queued: a lane takes them as
        soon as it is free (speculative prefetch: the reads a route really needs pass the
        guessed reads still queued). The caller must wait for a group (``Batch.wait``) before
        anything reads its destinations, and for the whole batch before it writes, evicts or
        frees them."""
        self.raise_if_failed()
        if not self._lanes:
            raise StreamIOError("the expert reader is closed")
        batch = Batch(
            self,
            [[c for op in _merge(ops) for c in self._split(op)] for ops in groups],
            [sum(op.nbytes for op in ops) for ops in groups],
        )
        for g, chunks in enumerate(batch.chunks):
            for c in chunks:
                if g in urgent:
                    self._urgent.put((batch, g, c))
                    self._queue.put(_WAKE)  # a lane blocked on the queue looks at the urgent one
                else:
                    self._queue.put((batch, g, c))
        batch.chunks = []  # the queue holds them now
        return batch

    def verify_files(self) -> None:
        """Raise FileChangedError (sticky) if a shard's size, mtime or inode changed, or, when its
        content sample is watched and a check is due, if the sampled bytes changed."""
        self.raise_if_failed()
        for f in self.files:
            try:
                now = FileId.of(f.path)
            except OSError as exc:
                self.fail(
                    FileChangedError(
                        f"model file {f.path} vanished while streaming ({exc.strerror}); reopen the session"
                    )
                )
            if now != f:
                self.fail(
                    FileChangedError(
                        f"model file {f.path} changed while streaming (size/mtime/inode differ "
                        "from when it was opened); reopen the session"
                    )
                )
        if self._content is not None and time.monotonic() >= self._content_due:
            self.check_content()

    def watch_content(self, sample: ContentSample) -> None:
        """From now on, ``verify_files`` also compares the shards' sampled bytes with ``sample``
        (taken from these files when the session opened), every ``CHECK_EVERY_S`` seconds at most
        and at most ``COST_SHARE`` of the time. Checks now."""
        if len(sample.digests) != len(self.files):
            raise ValueError(f"a content sample of {len(sample.digests)} shards for {len(self.files)} files")
        self._content = sample
        self.check_content()

    def check_content(self) -> None:
        """Compare the sampled bytes now; raise FileChangedError (sticky) naming the shard that differs."""
        self.raise_if_failed()
        if self._content is None:
            return
        t0 = time.perf_counter()
        try:
            bad = self._content.changed([f.path for f in self.files])
        except OSError as exc:
            self.fail(
                FileChangedError(
                    f"model file {exc.filename or self.files[0].path} could not be read for its "
                    f"content check ({exc.strerror or exc}); reopen the session"
                )
            )
        cost = time.perf_counter() - t0
        self.content_checks += 1
        self.content_s += cost
        self._content_due = time.monotonic() + max(CHECK_EVERY_S, cost / COST_SHARE)
        if bad is not None:
            self.fail(
                FileChangedError(
                    f"model file {self.files[bad].path} changed while streaming: its sampled bytes differ from when "
                    "it was opened although size, mtime and inode did not (overwritten in place); reopen the session"
                )
            )

    @property
    def odirect(self) -> bool:
        """Whether reads bypass the page cache now (False after a fallback)."""
        return self._io.odirect

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    @property
    def error(self) -> StreamIOError | None:
        return self._error

    def stats(self) -> StreamStats:
        """The reader's part of the stream's counters: bytes, read calls, read and stall time.
        ``io_s``: per batch, wall time from its submit to its last read done (and seen done by a
        waiter that was blocked on it); ``stall_s``: time callers spent blocked in Batch.wait."""
        with self._lock:
            return StreamStats(
                read_bytes=self._read_bytes,
                device_bytes=self._device_bytes,
                n_syscalls=self._n_syscalls,
                io_s=self._io_s,
                stall_s=self._stall_s,
            )

    def close(self) -> None:
        """Stop the lanes once they have finished what is queued, then close the files."""
        for _ in self._lanes:
            self._queue.put(None)
        for lane in self._lanes:
            lane.join()
        self._lanes = []
        self._close_fds()

    # --- internals ----------------------------------------------------------------------
    def fail(self, exc: StreamIOError) -> None:
        """Record ``exc`` as the sticky error (the first one wins) and raise it."""
        if self._error is None:
            self._error = exc
        raise self._error

    def _open_all(self, flags: int) -> tuple[int, ...]:
        """One fd per shard, opened one at a time: if a shard's open fails, those opened are closed."""
        fds: list[int] = []
        try:
            for f in self.files:
                fds.append(os.open(f.path, flags))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return tuple(fds)

    def _close_fds(self) -> None:
        for fd in self._io.fds + tuple(self._retired):
            os.close(fd)
        self._io, self._retired = _Fds((), self._io.odirect), []

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

    def _lane(self) -> None:
        while True:
            item: tuple[Batch, int, ReadOp] | None
            try:
                item = self._urgent.get_nowait()
            except queue.Empty:
                item = self._queue.get()
                if item is None:
                    return
                if item is _WAKE:
                    continue  # its urgent read was taken by whichever lane came first
            batch, g, op = item
            err: BaseException | None = None
            skipped = batch.stopped  # after a failure or an abandon, the rest is skipped, not read
            if not skipped:
                try:
                    self._read_one(op)
                except BaseException as exc:  # noqa: BLE001 - handed to the waiter, never lost
                    err = exc
            batch._chunk_done(g, time.perf_counter(), err, skipped)

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
                raise StreamIOError(
                    f"reading {path} at offset {offset + got} failed: {exc.strerror or exc}; "
                    "streaming stopped for this session"
                ) from exc
            self._count(len(buf) - got)
            if n == 0:
                path = self.files[op.file_index].path
                raise StreamIOError(
                    f"{path} ended at offset {offset + got}, before the expert bytes at "
                    f"{op.offset}+{op.nbytes}: truncated or replaced file; reopen the session"
                )
            got += n

    def _read_one(self, op: ReadOp) -> None:
        io = self._io  # once: another lane's fallback may swap fds and mode at any point below
        fd = io.fds[op.file_index]
        if not io.odirect:
            self._pread_exact(fd, op.window.view[op.at : op.at + op.nbytes], op.offset, op.nbytes, op)
            return
        try:
            self._read_direct(fd, op)
        except StreamIOError as exc:
            if not (isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EINVAL):
                raise
            self._fallback_buffered(io, op.file_index)
            self._read_one(op)

    def _fallback_buffered(self, seen: _Fds, refused: int) -> None:
        """Swap the O_DIRECT fds ``seen`` for buffered ones, unless another lane did already
        (``refused``: the shard whose read was refused, for the warning)."""
        # Some filesystems accept O_DIRECT at open and refuse it at read time.
        with self._lock:
            if self._io is not seen:
                return
            fds = self._open_all(os.O_RDONLY)
            # Other lanes may still be inside preadv on the old fds: retire them, close at close().
            self._retired += seen.fds
            self._io = _Fds(fds, False)
        self._warn(
            f"bmoe: O_DIRECT reads refused on {self.files[refused].path}; reading experts through the page cache"
        )

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
            op.window.view[op.at + done : op.at + done + take] = bounce[off - blk : off - blk + take]
            done += take

    def _bounce(self) -> memoryview:
        buf = getattr(self._local, "bounce", None)
        if buf is None:
            self._local.mm = mmap.mmap(-1, _BOUNCE_BYTES)  # anonymous maps are page aligned
            buf = self._local.bounce = memoryview(self._local.mm)
        return buf


class Batch:
    """Reads submitted together, in groups; see ExpertReader.submit.

    Waits happen in the submitting thread (the graph callback); lanes only read and count down.
    ``wait(g)`` returns once group ``g``'s bytes are all in place, and raises the reader's sticky
    error when some of them never will be: a read of the group failed, or was skipped because
    another read of the batch failed first (the lanes then skip what is still queued). It raises
    only once every lane has let go of the batch, so nothing of it is in flight any more."""

    def __init__(self, reader: ExpertReader, chunks: list[list[ReadOp]], nbytes: list[int]) -> None:
        self.reader = reader
        self.chunks = chunks
        self.t0 = time.perf_counter()
        self._nbytes = nbytes
        self._cond = threading.Condition(threading.Lock())
        self._left = [len(c) for c in chunks]  # chunks of each group not yet done
        self._bad = [False] * len(chunks)  # a chunk of the group failed or was skipped
        self._waited = [False] * len(chunks)
        self._end = self.t0  # when the last chunk so far finished
        self._error: BaseException | None = None  # the first failure
        self.stopped = False  # lanes skip this batch's remaining chunks
        self._closed = False  # io time booked; nothing of it in flight

    @property
    def n_groups(self) -> int:
        return len(self._left)

    def is_waited(self, g: int) -> bool:
        return self._waited[g]

    @property
    def done(self) -> bool:
        return all(self._waited)

    def wait(self, g: int) -> None:
        """Block until group ``g``'s bytes are in place (see the class)."""
        if self._waited[g]:
            return
        r = self.reader
        t0 = time.perf_counter()
        with self._cond:
            if self._left[g]:
                while self._left[g]:
                    self._cond.wait()
                # Blocked time is stall; the batch's read time runs at least until the waiter
                # saw its reads done (so stall never exceeds io, whatever the wake-up delay).
                t1 = time.perf_counter()
                self._end = max(self._end, t1)
                r._stall_s += t1 - t0
            bad = self._bad[g]
        if bad:
            self._fail(self._error or StreamIOError("reading experts was abandoned"))
        self._waited[g] = True
        r._read_bytes += self._nbytes[g]
        if all(self._waited):
            self._close()

    def wait_all(self) -> None:
        for g in range(self.n_groups):
            self.wait(g)

    def abandon(self) -> None:
        """Skip what is still queued and wait for what the lanes are reading (error paths, close)."""
        self.stopped = True
        self._quiesce()
        self._close()

    # --- internals ----------------------------------------------------------------------
    def _chunk_done(self, g: int, end: float, err: BaseException | None, skipped: bool) -> None:  # on a lane
        with self._cond:
            self._left[g] -= 1
            self._end = max(self._end, end)
            if err is not None or skipped:
                self._bad[g] = True
            if err is not None and self._error is None:
                self._error = err
                self.stopped = True
            if not self._left[g]:  # wake the waiter once per group, not once per chunk
                self._cond.notify_all()

    def _quiesce(self) -> None:
        with self._cond:
            while any(self._left):
                self._cond.wait()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            r = self.reader
            # Batches in flight at once (a prefetch and its route's own reads) count once: io_s
            # is the time any read was in flight, the union of the spans.
            r._io_s += max(0.0, self._end - max(self.t0, r._covered))
            r._covered = max(r._covered, self._end)

    def _fail(self, err: BaseException) -> None:
        self.stopped = True
        self._quiesce()  # nothing of this batch may still write once the error is out
        self._close()
        if isinstance(err, StreamIOError):
            self.reader.fail(err)
        self.reader.fail(StreamIOError(f"reading experts failed: {err}"))  # anything the lanes did not translate
