"""Reader: exact bytes at exact places, O_DIRECT in place and through bounce buffers, fallback,
exact counters, sticky errors."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from bmoe.stream.layout import FileId
from bmoe.stream.reader import ALIGN, ExpertReader, FileChangedError, ReadOp, StreamIOError, Window

SIZE = 3 * (1 << 20) + 777


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    return path, data


def _window(size: int, fill: int = 0xAA) -> tuple[mmap.mmap, Window]:
    mm = mmap.mmap(-1, size)
    mm.write(bytes([fill]) * size)
    return mm, Window.over(mm)


# (offset, nbytes): unaligned head and tail, aligned, tiny inside one block, across chunk
# boundaries, and ending at EOF (the O_DIRECT read there comes back short).
CASES = [(32, 6528), (4096, 8192), (5000, 10), (ALIGN - 5, 10), ((1 << 20) - 100, 300_000), (SIZE - 999, 999)]


@pytest.mark.parametrize("odirect", [True, False])
@pytest.mark.parametrize("offset,nbytes", CASES)
def test_in_place_reads_put_file_bytes_at_file_positions(data_file, odirect, offset, nbytes) -> None:
    path, data = data_file
    r = ExpertReader([FileId.of(path)], odirect=odirect, io_threads=2, chunk_bytes=1 << 18)
    assert r.odirect == odirect  # ext4 tmp dir: O_DIRECT really on
    mm, w = _window(SIZE + ALIGN)
    r.read([ReadOp(0, offset, nbytes, w, offset)])  # window mirrors the file: congruent
    view = bytes(mm)
    assert view[offset : offset + nbytes] == data[offset : offset + nbytes]
    # Bytes around the slice may only hold the file's own bytes (in-place aligned reads) or be untouched.
    lo, hi = offset - offset % ALIGN, min(SIZE, -(-(offset + nbytes) // ALIGN) * ALIGN)
    for a, b in ((lo, offset), (offset + nbytes, hi)):
        assert view[a:b] in (data[a:b], b"\xaa" * (b - a))
    assert view[:lo] == b"\xaa" * lo and view[hi + ALIGN :] == b"\xaa" * (len(view) - hi - ALIGN)
    s = r.stats()
    assert s.read_bytes == nbytes
    assert s.device_bytes >= nbytes
    r.close()


@pytest.mark.parametrize("offset,nbytes", CASES)
def test_unaligned_destination_goes_through_bounce_and_writes_only_the_slice(data_file, offset, nbytes) -> None:
    path, data = data_file
    r = ExpertReader([FileId.of(path)], odirect=True, io_threads=1)
    mm, w = _window(nbytes + 3 * ALIGN)
    at = ALIGN + 1  # not congruent with any file offset multiple: in-place impossible
    if (w.addr + at - offset) % ALIGN == 0:
        at += 1
    r.read([ReadOp(0, offset, nbytes, w, at)])
    view = bytes(mm)
    assert view[at : at + nbytes] == data[offset : offset + nbytes]
    assert view[:at] == b"\xaa" * at and view[at + nbytes :] == b"\xaa" * (len(view) - at - nbytes)
    assert r.stats().read_bytes == nbytes
    r.close()


def test_adjacent_ops_merge_and_lanes_fill_everything(data_file) -> None:
    path, data = data_file
    r = ExpertReader([FileId.of(path)], odirect=True, io_threads=4, chunk_bytes=1 << 16)
    mm, w = _window(SIZE + ALIGN)
    base, size = 4096 * 3, 6528
    ops = [ReadOp(0, base + e * size, size, w, base + e * size) for e in (3, 0, 1, 2, 7)]
    r.read(ops)
    view = bytes(mm)
    for e in (0, 1, 2, 3, 7):
        a = base + e * size
        assert view[a : a + size] == data[a : a + size]
    s = r.stats()
    assert s.read_bytes == 5 * size
    assert s.n_syscalls == 2  # experts 0..3 coalesced into one read, 7 alone
    r.close()


def test_tmpfs_o_direct_either_works_or_falls_back_with_one_warning() -> None:
    # Older kernels refuse O_DIRECT on tmpfs, newer ones accept it (this machine does); either
    # way the bytes must arrive, and only a refusal may warn, once.
    path = Path("/dev/shm") / f"bmoe-reader-{os.getpid()}.bin"
    data = bytes(range(256)) * 100
    path.write_bytes(data)
    warnings: list[str] = []
    try:
        r = ExpertReader([FileId.of(path)], odirect=True, warn=warnings.append)
        mm, w = _window(len(data))
        r.read([ReadOp(0, 33, 5000, w, 33)])
        assert bytes(mm)[33:5033] == data[33:5033]
        if r.odirect:
            assert warnings == [] and r.stats().device_bytes >= 5000
        else:
            assert len(warnings) == 1 and "O_DIRECT" in warnings[0]
            assert r.stats().device_bytes == 5000  # buffered: no alignment overhead
        r.close()
        silent: list[str] = []
        ExpertReader([FileId.of(path)], odirect=False, warn=silent.append).close()
        assert silent == []  # --no-odirect: no attempt, no warning
    finally:
        path.unlink()


def test_truncated_file_is_a_sticky_error(data_file, tmp_path: Path) -> None:
    path, data = data_file
    r = ExpertReader([FileId.of(path)], odirect=False, io_threads=1)
    with open(path, "r+b") as f:
        f.truncate(1000)
    mm, w = _window(SIZE)
    with pytest.raises(StreamIOError, match="truncated or replaced"):
        r.read([ReadOp(0, 5000, 100, w, 5000)])
    with pytest.raises(StreamIOError, match="truncated or replaced"):
        r.read([ReadOp(0, 0, 10, w, 0)])  # sticky, even for bytes that exist
    r.close()


def test_changed_file_is_detected_by_size_mtime_inode(data_file) -> None:
    path, data = data_file
    r = ExpertReader([FileId.of(path)], odirect=False)
    r.verify_files()  # unchanged: fine
    replacement = path.with_suffix(".new")
    replacement.write_bytes(data)
    os.replace(replacement, path)  # same size and bytes, new inode
    with pytest.raises(FileChangedError, match="changed while streaming"):
        r.verify_files()
    assert isinstance(r.error, FileChangedError)
    r.close()


def test_open_refusing_o_direct_falls_back_with_one_warning(data_file, monkeypatch) -> None:
    """What a filesystem without O_DIRECT does (EINVAL at open), simulated where tmpfs accepts it."""
    import errno

    path, data = data_file
    real_open = os.open

    def refusing_open(p, flags, *a):  # noqa: ANN001, ANN002
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *a)

    monkeypatch.setattr(os, "open", refusing_open)
    warnings: list[str] = []
    r = ExpertReader([FileId.of(path)], odirect=True, warn=warnings.append)
    assert not r.odirect and len(warnings) == 1 and "O_DIRECT refused" in warnings[0]
    mm, w = _window(SIZE)
    r.read([ReadOp(0, 33, 5000, w, 33)])
    assert bytes(mm)[33:5033] == data[33:5033]
    assert r.stats().device_bytes == 5000  # buffered: no alignment overhead
    r.close()


def test_read_refusing_o_direct_falls_back_once(data_file, monkeypatch) -> None:
    """Some filesystems accept O_DIRECT at open and fail the read with EINVAL."""
    import errno

    path, data = data_file
    r = ExpertReader([FileId.of(path)], odirect=True, io_threads=1, warn=(warnings := []).append)
    direct_fd = r._io.fds[0]
    real_preadv = os.preadv

    def picky_preadv(fd, bufs, off):  # noqa: ANN001
        if fd == direct_fd:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, off)

    monkeypatch.setattr(os, "preadv", picky_preadv)
    mm, w = _window(SIZE)
    r.read([ReadOp(0, 100, 9000, w, 100), ReadOp(0, 20000, 10, w, 20000)])
    r.read([ReadOp(0, 50000, 10, w, 50000)])
    view = bytes(mm)
    assert view[100:9100] == data[100:9100] and view[20000:20010] == data[20000:20010]
    assert view[50000:50010] == data[50000:50010]
    assert not r.odirect and len(warnings) == 1
    r.close()


def test_the_fallback_warning_names_the_shard_whose_read_was_refused(data_file, tmp_path: Path, monkeypatch) -> None:
    import errno

    path, data = data_file
    second = tmp_path / "blob-2.bin"
    second.write_bytes(data)
    r = ExpertReader([FileId.of(path), FileId.of(second)], odirect=True, io_threads=1, warn=(warnings := []).append)
    refusing = r._io.fds[1]
    real_preadv = os.preadv

    def picky_preadv(fd, bufs, off):  # noqa: ANN001 - only the second shard's filesystem refuses
        if fd == refusing:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, off)

    monkeypatch.setattr(os, "preadv", picky_preadv)
    mm, w = _window(SIZE)
    r.read([ReadOp(1, 100, 9000, w, 100)])
    assert bytes(mm)[100:9100] == data[100:9100]
    assert warnings == [f"bmoe: O_DIRECT reads refused on {second}; reading experts through the page cache"]
    r.close()


def test_a_lane_reads_with_the_fds_and_mode_of_one_snapshot(data_file, monkeypatch) -> None:
    """Another lane's fallback may swap the fds and the mode between a lane's look at its fd and its
    read: the read must go with the fd it took, not as a buffered read on an O_DIRECT fd."""
    import errno
    import threading

    path, data = data_file
    real_open, real_preadv = os.open, os.preadv
    direct: set[int] = set()

    def open_(p, flags, *a):  # noqa: ANN001, ANN002, ANN202 - O_DIRECT simulated on any filesystem
        fd = real_open(p, flags & ~os.O_DIRECT, *a)
        if flags & os.O_DIRECT:
            direct.add(fd)
        return fd

    def preadv(fd, bufs, off):  # noqa: ANN001, ANN202 - accepted at open, refused at read
        if fd in direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, off)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "preadv", preadv)
    swapped = threading.Event()
    first_look = threading.Lock()

    class HeldAfterLook(ExpertReader):
        """The first lane to look at the fd state (``_fds`` before the fix, ``_io`` after) is held
        right after the look until another lane's fallback has swapped it."""

        held = False

        def __getattribute__(self, name: str):  # noqa: ANN204
            value = super().__getattribute__(name)
            if name in ("_fds", "_io") and threading.current_thread().name.startswith("bmoe-io-"):
                with first_look:
                    hold, HeldAfterLook.held = not HeldAfterLook.held, True
                if hold:
                    assert swapped.wait(10)
            return value

    def warn(msg: str) -> None:  # the fallback warns once it has swapped
        warnings.append(msg)
        swapped.set()

    warnings: list[str] = []
    r = HeldAfterLook([FileId.of(path)], odirect=True, io_threads=2, warn=warn)
    assert r.odirect and direct
    mm, w = _window(SIZE)
    r.read([ReadOp(0, 33, 5000, w, 33), ReadOp(0, 70_000, 3000, w, 70_000)])  # not adjacent: two reads
    view = bytes(mm)
    assert view[33:5033] == data[33:5033] and view[70_000:73_000] == data[70_000:73_000]
    assert r.error is None and not r.odirect and len(warnings) == 1
    r.close()


def test_a_failed_content_read_names_the_shard_it_failed_on(tmp_path: Path, monkeypatch) -> None:
    import errno

    from bmoe.stream.content import ContentSample, digests

    shards = [tmp_path / f"m-{i}.gguf" for i in range(2)]
    for i, p in enumerate(shards):
        p.write_bytes(bytes([i]) * 3 * 4096)
    blocks = (((0, 4096), (8192, 4096)),) * 2
    r = ExpertReader([FileId.of(p) for p in shards], odirect=False, io_threads=1)
    r.watch_content(ContentSample(blocks, digests(shards, blocks)))
    real_pread = os.pread

    def pread(fd, n, off):  # noqa: ANN001, ANN202 - the second shard's disk fails
        if os.readlink(f"/proc/self/fd/{fd}") == str(shards[1]):
            raise OSError(errno.EIO, "Input/output error")
        return real_pread(fd, n, off)

    monkeypatch.setattr(os, "pread", pread)
    with pytest.raises(
        FileChangedError,
        match=rf"^model file {shards[1]} could not be read for its content check "
        r"\(Input/output error\); reopen the session$",
    ):
        r.check_content()
    r.close()


# --- split phase: submit now, wait per group -------------------------------------------------


class GatedPreadv:
    """os.preadv that records the offsets it is asked for and holds reads at or beyond ``hold_from``
    until ``release`` is set (optionally failing them then)."""

    def __init__(self, hold_from: int, fail_held: bool = False) -> None:
        import threading

        self.real = os.preadv
        self.hold_from = hold_from
        self.fail_held = fail_held
        self.release = threading.Event()
        self.offsets: list[int] = []

    def __call__(self, fd, bufs, off):  # noqa: ANN001, ANN204
        self.offsets.append(off)
        if off >= self.hold_from:
            assert self.release.wait(10)
            if self.fail_held:
                import errno

                raise OSError(errno.EIO, "Input/output error")
        return self.real(fd, bufs, off)


def test_submit_returns_at_once_and_each_group_is_waited_on_its_own(data_file, monkeypatch) -> None:
    path, data = data_file
    gate = GatedPreadv(hold_from=1 << 20)
    monkeypatch.setattr(os, "preadv", gate)
    r = ExpertReader([FileId.of(path)], odirect=False, io_threads=2)
    mm, w = _window(SIZE)
    first = [ReadOp(0, 100, 5000, w, 100), ReadOp(0, 9000, 70_000, w, 9000)]
    later = [ReadOp(0, (1 << 20) + 10, 4000, w, (1 << 20) + 10)]
    batch = r.submit([first, later])
    batch.wait(0)  # returns while the later group is still held
    view = bytes(mm)
    assert view[100:5100] == data[100:5100] and view[9000:79_000] == data[9000:79_000]
    assert view[(1 << 20) + 10 : (1 << 20) + 4010] == b"\xaa" * 4000  # not read yet
    assert batch.is_waited(0) and not batch.is_waited(1) and not batch.done
    assert r.stats().read_bytes == 75_000  # a group counts once it is waited for
    gate.release.set()
    batch.wait(1)
    assert bytes(mm)[(1 << 20) + 10 : (1 << 20) + 4010] == data[(1 << 20) + 10 : (1 << 20) + 4010]
    s = r.stats()
    assert batch.done and s.read_bytes == 79_000
    assert 0 < s.stall_s <= s.io_s  # the waits' blocked time is part of the batch's read time
    r.close()


def test_lanes_take_reads_in_submit_order_not_file_order(data_file, monkeypatch) -> None:
    path, data = data_file
    gate = GatedPreadv(hold_from=SIZE)  # holds nothing: only records
    monkeypatch.setattr(os, "preadv", gate)
    r = ExpertReader([FileId.of(path)], odirect=False, io_threads=1, chunk_bytes=1 << 16)
    mm, w = _window(SIZE)
    high, low = (2 << 20, 300_000), (1000, 5000)  # the group queued first lies later in the file
    r.submit([[ReadOp(0, high[0], high[1], w, high[0])], [ReadOp(0, low[0], low[1], w, low[0])]]).wait_all()
    assert gate.offsets[0] == high[0] and gate.offsets[-1] == low[0]  # one lane: strictly in queue order
    assert all(o >= high[0] for o in gate.offsets[:-1])
    assert bytes(mm)[low[0] : sum(low)] == data[low[0] : sum(low)]
    r.close()


def test_failed_read_surfaces_at_its_groups_wait_and_stays_sticky(data_file, monkeypatch) -> None:
    path, data = data_file
    gate = GatedPreadv(hold_from=1 << 20, fail_held=True)
    monkeypatch.setattr(os, "preadv", gate)
    r = ExpertReader([FileId.of(path)], odirect=False, io_threads=1, chunk_bytes=1 << 16)
    mm, w = _window(SIZE)
    batch = r.submit([[ReadOp(0, 0, 4096, w, 0)], [ReadOp(0, 1 << 20, 300_000, w, 1 << 20)]])
    batch.wait(0)  # its bytes are in place: no error here
    assert r.error is None and bytes(mm)[:4096] == data[:4096]
    gate.release.set()
    with pytest.raises(StreamIOError, match="Input/output error"):
        batch.wait(1)
    # The failed chunk was the group's first of five: the lane skipped the other four.
    assert sum(o >= 1 << 20 for o in gate.offsets) == 1
    assert r.stats().read_bytes == 4096
    with pytest.raises(StreamIOError, match="Input/output error"):
        r.submit([[ReadOp(0, 0, 10, w, 0)]])  # sticky
    r.close()


def test_close_waits_for_queued_reads(data_file, monkeypatch) -> None:
    path, data = data_file
    r = ExpertReader([FileId.of(path)], odirect=False, io_threads=2, chunk_bytes=1 << 16)
    mm, w = _window(SIZE)
    r.submit([[ReadOp(0, 0, SIZE, w, 0)]])
    r.close()  # no wait: close itself lets the lanes finish the queue before the files close
    assert bytes(mm) == data
