"""The sampled content check: deterministic blocks of every region, a change of one sampled block
found by the reader's verify path on its schedule, as the sticky FileChangedError naming the file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bmoe.stream import read_layout
from bmoe.stream.content import BLOCK, CHECK_EVERY_S, PER_REGION, ContentSample, dense_ranges
from bmoe.stream.reader import ExpertReader, FileChangedError


@pytest.fixture()
def model(tiny_models, tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_models("qwen3moe", "q8_0").read_bytes())
    return path


def _poke(path: Path, offset: int) -> None:
    """Flip one byte in place; size, mtime and inode stay."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_sample_covers_every_region_and_is_the_same_in_every_process(model: Path) -> None:
    layout = read_layout(model)
    s = ContentSample.take(layout)
    assert s == ContentSample.take(read_layout(model))  # fixed offsets, same bytes: same hashes
    regions = [(t.offset, t.offset + t.nbytes) for t in layout.experts] + dense_ranges(layout, 0)
    for a, b in regions:
        inside = [(o, n) for o, n in s.blocks[0] if a <= o and o + n <= b]
        assert 1 <= len(inside) <= PER_REGION and all(n <= BLOCK for _, n in inside), (a, b)
    assert s.n_blocks <= PER_REGION * len(regions)
    assert sum(n for _, n in s.blocks[0]) < 200 * 1024  # a few KiB per region, not the file


def test_a_changed_sampled_byte_is_a_sticky_error_once_the_check_is_due(model: Path) -> None:
    layout = read_layout(model)
    r = ExpertReader(layout.files, odirect=False, io_threads=1)
    try:
        r.watch_content(ContentSample.take(layout))  # checks at once
        assert r.content_checks == 1
        expert = layout.experts[0]
        off = next(o for o, _ in r._content.blocks[0] if expert.offset <= o < expert.offset + expert.nbytes)
        _poke(model, off + 7)
        r.verify_files()  # size, mtime and inode agree, and the next content check is not due yet
        assert r.content_checks == 1 and r.error is None
        time.sleep(CHECK_EVERY_S + 0.05)
        with pytest.raises(
            FileChangedError,
            match=rf"^model file {model} changed while streaming: its sampled "
            r"bytes differ .*overwritten in place\); reopen the session$",
        ):
            r.verify_files()
        assert r.content_checks == 2 and isinstance(r.error, FileChangedError)
        _poke(model, off + 7)  # restored: the error stays
        with pytest.raises(FileChangedError, match="overwritten in place"):
            r.verify_files()
    finally:
        r.close()


def test_a_byte_outside_the_sample_is_not_seen(model: Path) -> None:
    """What the check does not promise: a change that touches no sampled block goes unnoticed."""
    layout = read_layout(model)
    sample = ContentSample.take(layout)
    t = layout.experts[0]
    sampled = [(o, o + n) for o, n in sample.blocks[0]]
    off = next(x for x in range(t.offset, t.offset + t.nbytes, 997) if not any(a <= x < b for a, b in sampled))
    _poke(model, off)
    assert sample.changed([model]) is None


def test_the_check_takes_a_bounded_share_of_the_time(model: Path, monkeypatch) -> None:
    """A check that costs c seconds is not repeated for max(CHECK_EVERY_S, c / COST_SHARE)."""
    from bmoe.stream.content import COST_SHARE

    layout = read_layout(model)
    sample = ContentSample.take(layout)
    changed = ContentSample.changed

    def slow(self, paths):  # noqa: ANN001, ANN202 - a check on a slow disk
        time.sleep(0.05)
        return changed(self, paths)

    monkeypatch.setattr(ContentSample, "changed", slow)
    r = ExpertReader(layout.files, odirect=False, io_threads=1)
    try:
        t0 = time.monotonic()
        r.watch_content(sample)
        assert r._content_due - t0 >= 0.05 / COST_SHARE  # 10 s, not CHECK_EVERY_S
        r.verify_files()
        assert r.content_checks == 1
    finally:
        r.close()
