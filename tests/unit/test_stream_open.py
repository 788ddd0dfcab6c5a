"""A streamer or reader whose open fails leaves nothing behind: no read lane running, no shard fd
open, no expert buffer mapped; and the error names what failed, as an OSError, the kind
open_streaming turns into its ``--moe-stream: <model>: ...`` refusal."""

from __future__ import annotations

import errno
import mmap
import os
import threading
from pathlib import Path

import pytest

from bmoe.stream import Streamer, StreamSettings
from bmoe.stream import cache as cache_mod
from bmoe.stream.budget import Budget
from bmoe.stream.layout import FileId
from bmoe.stream.reader import ExpertReader
from helpers.stream import make_layout


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _lanes() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("bmoe-io-") and t.is_alive()}


def _refusal(err: BaseException, model: Path) -> str:
    """What the user reads: open_streaming turns an OSError (in its except tuple) into this."""
    from bmoe.config import SessionConfig
    from bmoe.runtime.expert_streaming import StreamSetupError, _setup_error

    assert isinstance(err, OSError)
    out = _setup_error(SessionConfig(model=model, moe_stream=True), err)
    assert isinstance(out, StreamSetupError)
    return str(out)


@pytest.mark.parametrize("cache_on", [True, False])
def test_a_failed_buffer_map_leaves_no_lane_fd_or_mapping(tmp_path: Path, monkeypatch, cache_on: bool) -> None:
    """What vm.overcommit_memory=2 does to a large model's expert buffers (ENOMEM at mmap)."""
    layout, _ = make_layout(tmp_path)
    real = cache_mod.TensorBuffer
    made: list[cache_mod.TensorBuffer] = []

    def failing(tensors):  # noqa: ANN001, ANN202 - the third mapping is refused
        if len(made) == 2:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        made.append(real(tensors))
        return made[-1]

    monkeypatch.setattr(cache_mod, "TensorBuffer", failing)
    budget = Budget(layout.floor_bytes() if cache_on else 0, layout.floor_bytes(), "fixed" if cache_on else "off")
    lanes, fds = _lanes(), _fds()
    with pytest.raises(OSError) as e:
        Streamer(layout, StreamSettings(cache_mb=1 if cache_on else 0, io_threads=4), budget=budget)
    assert _lanes() == lanes and _fds() == fds
    assert all(b.mm.closed for b in made)  # the two mapped before the refusal are unmapped
    sizes = [-(-(t.offset % 4096 + t.nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE for t in layout.experts]
    if not cache_on:  # one buffer per projection, as big as its biggest tensor
        sizes = [max(n for n, t in zip(sizes, layout.experts) if t.proj == p) for p in {t.proj for t in layout.experts}]
    mib = -(-sum(sizes) // (1 << 20))
    assert e.value.errno == errno.ENOMEM and str(e.value) == (
        f"[Errno 12] cannot map the expert buffers ({mib} MiB of address space): Cannot allocate memory; "
        "with vm.overcommit_memory=2 the kernel charges all of it at once"
    )
    assert _refusal(e.value, layout.files[0].path) == f"--moe-stream: {layout.files[0].path}: {e.value}"


@pytest.mark.parametrize("odirect", [True, False])
def test_a_shard_that_cannot_be_opened_leaves_no_fd(tmp_path: Path, monkeypatch, odirect: bool) -> None:
    shards = [tmp_path / f"m-{i}.gguf" for i in range(3)]
    for p in shards:
        p.write_bytes(b"\0" * 8192)
    files = [FileId.of(p) for p in shards]
    real_open = os.open

    def open_(path, flags, *a):  # noqa: ANN001, ANN002, ANN202 - the last shard is refused
        if Path(path) == shards[-1]:
            raise OSError(errno.EMFILE, "Too many open files", str(path))
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", open_)
    lanes, fds = _lanes(), _fds()
    with pytest.raises(OSError, match="Too many open files"):
        ExpertReader(files, odirect=odirect, warn=lambda _: None)
    assert _fds() == fds and _lanes() == lanes


def test_a_lane_that_cannot_start_stops_the_others_and_closes_the_files(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"\0" * 8192)
    real_start = threading.Thread.start
    started: list[threading.Thread] = []

    def start(self: threading.Thread) -> None:  # the process may start two more threads, not three
        if self.name.startswith("bmoe-io-"):
            if len(started) == 2:
                raise RuntimeError("can't start new thread")
            started.append(self)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    lanes, fds = _lanes(), _fds()
    with pytest.raises(Exception) as e:
        ExpertReader([FileId.of(path)], odirect=False, io_threads=8)
    assert len(started) == 2 and not any(t.is_alive() for t in started)
    assert _fds() == fds and _lanes() == lanes
    assert _refusal(e.value, path) == (
        f"--moe-stream: {path}: [Errno 11] cannot start read lane 3 of 8 (can't start new thread); try fewer io_threads"
    )
