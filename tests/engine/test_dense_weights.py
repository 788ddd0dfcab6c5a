"""--dense-weights anon|mmap on the tiny qwen3moe: where the dense pages live, what the session
reports about them, and what is refused. (Exactness of both modes: tests/gates/test_dense_weights_exact.py.)"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from bmoe.cli.loop import run_session
from bmoe.config import SessionConfig
from bmoe.errors import ConfigError
from bmoe.llama.dense_anon import AnonDense, DenseAnonError, drop_unused, file_segments, regions
from bmoe.llama.residency import PAGE, PageResidency
from bmoe.runtime.results import GenerateRequest

GEN = GenerateRequest(prompt="Tell me about the sea.", n_predict=8, keep_logits=True)


def _twin_dense(s) -> list[tuple[Path, list[tuple[int, int]]]]:
    return [(p, list(r)) for p, r in s.streaming.dense_files]


def _drop_page_cache(files: list[tuple[Path, list[tuple[int, int]]]]) -> None:
    """Ask the kernel to drop the files' clean page-cache pages; mapped pages it keeps."""
    for path, _ in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _fs_drops_pages(folder: Path) -> bool:
    """Whether POSIX_FADV_DONTNEED drops clean pages of a file in ``folder`` (not on tmpfs)."""
    probe = folder / "fadvise-probe"
    probe.write_bytes(b"x" * (16 * PAGE))
    os.sync()
    with open(probe, "rb") as f:
        f.read()
    watch = PageResidency([(probe, [(0, 16 * PAGE)])])
    try:
        _drop_page_cache([(probe, [])])
        return watch.fraction() < 1.0
    finally:
        watch.close()
        probe.unlink()


def test_anon_pages_are_not_the_files_so_dropping_the_file_changes_nothing(open_tiny, tmp_path) -> None:
    ref_session = open_tiny(moe_stream=True, dense_weights="mmap", twin_dir=tmp_path / "twins")
    ref = ref_session.generate(GEN)
    ref_session.close()  # nothing maps the twin any more but the anon session below
    s = open_tiny(moe_stream=True, twin_dir=tmp_path / "twins")  # anon: the default when streaming
    assert s.streaming.dense_weights == "anon" and s.config.dense_weights is None
    spans = s.streaming.dense.spans
    assert spans and s.dense_anon_bytes == sum(hi - lo for lo, hi in spans)
    # no file mapping of the twin covers a held page any more: they are anonymous
    twin = os.stat(s.streaming.load_path)
    for seg in file_segments():
        if seg.inode == twin.st_ino:
            assert all(hi <= seg.start or lo >= seg.end for lo, hi in spans)
    if not _fs_drops_pages(tmp_path):
        pytest.skip("this file system keeps clean pages on POSIX_FADV_DONTNEED (tmpfs?)")
    files = _twin_dense(s)
    on_disk = PageResidency(files)
    try:
        _drop_page_cache(files)
        assert on_disk.fraction() == 0.0  # the kernel could drop every dense page of the file...
        out = s.generate(GEN)
        # ... and the session answers the same without reading one of them back
        assert out.tokens == ref.tokens and all((x == y).all() for x, y in zip(out.logits, ref.logits, strict=True))
        assert on_disk.fraction() == 0.0 and s.dense_resident_frac() == 1.0
    finally:
        on_disk.close()


def test_mmap_measures_the_files_page_cache(open_tiny, tmp_path) -> None:
    s = open_tiny(moe_stream=True, dense_weights="mmap", twin_dir=tmp_path / "twins")
    assert s.dense_anon_bytes == 0 and isinstance(s.streaming.dense, PageResidency)
    assert s.dense_resident_frac() == 1.0  # populated at load, and mapped: the kernel keeps them


def test_ready_reports_the_mode_and_the_bytes_held(open_tiny, tmp_path) -> None:
    for kw, mode in (({}, "anon"), ({"dense_weights": "mmap"}, "mmap")):
        s = open_tiny(moe_stream=True, twin_dir=tmp_path / "twins", **kw)
        out = io.StringIO()
        assert run_session(s, io.StringIO(""), out) == 0
        ready = json.loads(out.getvalue().splitlines()[0].partition(" ")[2])
        assert ready["dense_weights"] == mode
        assert ready["dense_anon_mib"] == round(s.dense_anon_bytes / 2**20, 2)
        assert (ready["dense_anon_mib"] > 0) == (mode == "anon")
    resident = open_tiny()
    out = io.StringIO()
    run_session(resident, io.StringIO(""), out)
    ready = json.loads(out.getvalue().splitlines()[0].partition(" ")[2])
    assert (ready["dense_weights"], ready["dense_anon_mib"]) == (None, 0.0)


def test_dense_weights_needs_moe_stream_and_a_known_mode(tiny_models) -> None:
    model = tiny_models("qwen3moe", "q8_0")
    with pytest.raises(ConfigError, match=r"^dense_weights: only means something with moe_stream"):
        SessionConfig(model=model, dense_weights="anon")
    with pytest.raises(ConfigError, match=r"^dense_weights: must be one of anon, mmap, got 'ram'"):
        SessionConfig(model=model, moe_stream=True, dense_weights="ram")
    assert SessionConfig(model=model, moe_stream=True).dense_anon
    assert not SessionConfig(model=model, moe_stream=True, dense_weights="mmap").dense_anon
    assert not SessionConfig(model=model).dense_anon


def test_regions_widen_to_pages_clip_to_what_is_mapped_and_merge() -> None:
    from bmoe.llama.dense_anon import Segment

    P = PAGE
    # the file is mapped from offset 2P at 0x10000000 for 10 pages (llama.cpp unmapped the header)
    seg = Segment(0x10000000, 0x10000000 + 10 * P, 2 * P, (0, 1), 7, "/m.gguf")
    got = regions([seg], [(0, 3 * P + 5), (3 * P + 100, 4 * P), (6 * P + 1, 7 * P - 1), (11 * P, 20 * P)])
    assert got == [
        (0x10000000, 0x10000000 + 2 * P),  # [2P, 4P): header part cut, the two ranges merged
        (0x10000000 + 4 * P, 0x10000000 + 5 * P),  # [6P, 7P): widened to the page
        (0x10000000 + 9 * P, 0x10000000 + 10 * P),
    ]  # [11P, 12P): what is mapped of [11P, 20P)


def test_maps_lines_are_parsed_and_anonymous_ones_skipped() -> None:
    text = (
        "7f26b70a9000-7f26b73d8000 r--s 00ea9000 fe:01 2146837                    /tmp/t/m.gguf\n"
        "7f26b73d8000-7f26b7411000 r--p 00000000 00:00 0 \n"
        "7ffd1000-7ffd2000 rw-p 00000000 00:00 0                          [stack]\n"
    )
    (seg,) = file_segments(text)
    assert (seg.start, seg.end, seg.offset, seg.dev, seg.inode, seg.path) == (
        0x7F26B70A9000,
        0x7F26B73D8000,
        0xEA9000,
        (0xFE, 1),
        2146837,
        "/tmp/t/m.gguf",
    )


def test_a_file_with_no_new_mapping_is_refused(tmp_path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * PAGE)
    with pytest.raises(DenseAnonError, match=r"^dense_weights: anon: llama.cpp's mapping of .*m.gguf is not in"):
        AnonDense.move(file_segments(), [(f, [(0, PAGE)])])


def test_drop_unused_skips_a_file_it_cannot_open() -> None:
    """Best effort: a file gone (or never there) is left out, never an error after the load."""
    assert drop_unused(frozenset(), [(Path("/nonexistent"), ((0, PAGE),))]) == 0


def test_a_twin_removed_while_the_model_loads_is_still_moved_and_given_back(open_tiny, tmp_path, monkeypatch) -> None:
    """``bmoe-cli --gc-twins 0`` in another process may unlink the twin while llama.cpp maps it:
    the mapping keeps the file, so the dense pages are still moved (found by the inode taken
    before the load) and the expert pages still given back, and the session answers as before."""
    import llama_cpp

    ref = open_tiny("lfm2moe", moe_stream=True, twin_dir=tmp_path / "ref-twins").generate(GEN).tokens
    load = llama_cpp.llama_model_load_from_file
    removed: list[Path] = []

    def load_then_remove(path: bytes, params):
        ptr = load(path, params)
        removed.append(Path(path.decode()))
        removed[-1].unlink()
        return ptr

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", load_then_remove)
    s = open_tiny("lfm2moe", moe_stream=True, twin_dir=tmp_path / "twins")
    assert removed == [s.streaming.load_path] and not removed[0].exists()
    assert s.streaming.dense_weights == "anon" and s.dense_anon_bytes > 0
    assert s.runtime.model.dropped_bytes > 0
    assert s.generate(GEN).tokens == ref


def _mapped_rss(path: Path) -> int:
    """Bytes of ``path`` mapped into this process with a page behind them (smaps Rss)."""
    total, inside = 0, False
    real = os.path.realpath(path)
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            inside = len(head) >= 6 and head[5] == real
        elif inside and line.startswith("Rss:"):
            total += int(head[1]) * 1024
    return total


@pytest.mark.parametrize("mode", ["anon", "mmap"])
def test_the_expert_pages_llama_cpp_populated_are_given_back(open_tiny, tmp_path, mode) -> None:
    """llama.cpp's MAP_POPULATE fills the twin's expert holes with zero pages; the session unmaps
    them once loaded, so only dense pages (mmap) or nothing (anon) of the twin stay mapped."""
    s = open_tiny(moe_stream=True, dense_weights=mode, twin_dir=tmp_path / "twins")
    layout = s.streaming.layout
    twin = s.streaming.load_path
    assert twin != s.config.model  # the dense twin was loaded
    assert s.runtime.model.dropped_bytes >= layout.expert_nbytes - 2 * PAGE * len(layout.experts)
    dense_pages = sum(-(-b // PAGE) * PAGE - a // PAGE * PAGE for _, r in s.streaming.dense_files for a, b in r)
    rss = _mapped_rss(twin)
    assert rss <= (dense_pages if mode == "mmap" else 2 * PAGE * len(layout.experts))
    assert s.generate(GEN).tokens  # and the model still runs
    s.close()
