"""The cache hands an evicted expert's pages to the expert that replaces it (bmoe.llama.mremap_mover over
mremap), and read-ahead (--prefetch) fills the cache. Exact: contents, counts, and which pages the
cache's buffers hold, on synthetic layouts (no llama.cpp needed)."""

from __future__ import annotations

import ctypes
import errno
import mmap
from pathlib import Path

import numpy as np
import pytest

import bmoe.llama.libc as libc_consts
import bmoe.llama.mremap_mover as pages_mod
from bmoe.llama.mremap_mover import LibcPageMover
from bmoe.stream import ExpertKey, Streamer, StreamSettings
from bmoe.stream.budget import Budget
from bmoe.stream.cache import ExpertCache
from bmoe.stream.layout import ExpertTensor
from helpers.stream import expert_bytes_in_buffer, make_layout

PAGE = mmap.PAGESIZE
MOVER = LibcPageMover()  # Linux, where bmoe runs: the adapter must be there

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def held_pages(cache: ExpertCache, t: ExpertTensor) -> set[int]:
    """Pages of ``t``'s buffer that have a physical page now (mincore), as page indexes."""
    buf = cache._buffers[(t.il, t.proj)]
    n = buf.size // PAGE
    vec = (ctypes.c_ubyte * n)()
    assert _libc.mincore(buf.window.addr, buf.size, vec) == 0
    return {i for i in range(n) if vec[i] & 1}


def expected_pages(cache: ExpertCache, t: ExpertTensor) -> set[int]:
    """The pages the resident experts of ``t``'s layer cover: all the cache may hold, and all it must."""
    pad = t.offset % 4096
    out: set[int] = set()
    for e in range(t.n_expert):
        if cache.is_resident(ExpertKey(t.il, e)):
            start = pad + e * t.slice_nbytes
            out.update(range(start // PAGE, -(-(start + t.slice_nbytes) // PAGE)))
    return out


def assert_holds_exactly_its_experts(s: Streamer, layout) -> None:
    assert isinstance(s.cache, ExpertCache)
    for t in layout.experts:
        assert held_pages(s.cache, t) == expected_pages(s.cache, t), t.name


def assert_in_place(s: Streamer, layout, data: bytes, il: int, experts) -> None:  # noqa: ANN001
    """Every projection of each of layer ``il``'s ``experts`` holds the file's bytes at its place."""
    for e in experts:
        for t in layout.layer_tensors(il):
            assert expert_bytes_in_buffer(s, t, int(e)) == data[t.slice_offset(int(e)) :][: t.slice_nbytes]


def drive(s: Streamer, layout, data: bytes, seed: int, rounds: int = 25) -> None:
    """Decode-like routes and a few 3-token ubatches; after each, every routed expert is in place."""
    rng = np.random.default_rng(seed)
    for r in range(rounds):
        for il in layout.layers:
            ids = rng.choice(layout.n_expert, size=(3 if r % 7 == 3 else 1, 2))
            s.on_route(il, ids)
            assert_in_place(s, layout, data, il, np.unique(ids))


# Slices of 12 pages + 528 bytes at unaligned offsets (interiors of 11 or 12 pages, varying), and
# of exactly 12 pages at an unaligned offset (every interior 11 pages, two end pages shared).
@pytest.mark.parametrize("slice_nbytes", [12 * 4096 + 528, 12 * 4096])
@pytest.mark.parametrize("odirect", [True, False])
@pytest.mark.parametrize("one_call", [True, False], ids=["one-call", "three-call"])
def test_moved_pages_carry_the_right_bytes_and_the_cache_holds_only_its_experts(
    tmp_path: Path, slice_nbytes, odirect, one_call
) -> None:
    layout, data = make_layout(tmp_path, n_expert=8, slice_nbytes=slice_nbytes)
    per = layout.expert_nbytes_in_layer(0)
    runs = {}
    for name, pages in (("moved", LibcPageMover(dontunmap=one_call)), ("released", None)):
        s = Streamer(layout, StreamSettings(odirect=odirect), budget=Budget(5 * per, 0, "fixed"), pages=pages)
        drive(s, layout, data, seed=3)
        assert_holds_exactly_its_experts(s, layout)
        assert s.stats().resident_bytes <= 5 * per
        runs[name] = (s.stats(), s.cache.moved_bytes, s.cache.released_bytes)
        s.close()
    (moved, moved_b, moved_rel), (plain, plain_moved, plain_rel) = runs["moved"], runs["released"]
    # The same decisions either way: the mover changes where pages come from, not what is cached.
    assert (moved.hits, moved.misses, moved.evictions, moved.read_bytes) == (
        plain.hits,
        plain.misses,
        plain.evictions,
        plain.read_bytes,
    )
    assert moved.evictions > 20 and plain_moved == 0 and moved_b > 0
    # Without the mover every evicted page is released; with it, only the end pages are (and the
    # whole of victims nobody took over): far fewer pages go back to the OS to be faulted in again.
    assert moved_rel < plain_rel / 3 and moved_b > plain_rel / 2


def test_a_victim_moves_to_an_incoming_expert_of_another_layer(tmp_path: Path) -> None:
    layout, data = make_layout(tmp_path, n_expert=8, slice_nbytes=5 * 4096 + 100)
    per = layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(), budget=Budget(2 * per, 0, "fixed"), pages=MOVER)
    s.on_route(0, np.array([[1, 2]]))
    s.on_route(3, np.array([[6, 7]]))  # evicts layer 0's two: their pages go to layer 3's two
    assert isinstance(s.cache, ExpertCache)
    interior = sum(
        4 * 4096 if (t.offset % 4096 + e * t.slice_nbytes) % 4096 else 5 * 4096
        for t in layout.layer_tensors(0)
        for e in (1, 2)
    )
    assert s.cache.moved_bytes >= interior - 3 * 2 * 4096
    assert_in_place(s, layout, data, 3, (6, 7))
    assert_holds_exactly_its_experts(s, layout)
    s.close()


def test_read_ahead_fills_the_cache_and_counts_what_it_read(tmp_path: Path) -> None:
    layout, data = make_layout(tmp_path, n_expert=8, slice_nbytes=3 * 4096 + 528)
    per = layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(), budget=Budget(6 * per, 0, "fixed"), pages=MOVER)
    s.on_route(1, np.array([[0, 1]]))  # 0, 1 cached: 2 misses
    s.prefetch(1, np.array([0, 2, 3]))  # 0 is cached: only 2 and 3 are read ahead
    st = s.stats()
    assert (st.guessed, st.hits, st.misses) == (2, 0, 2)  # a guess is no lookup
    assert s.cache.is_resident(ExpertKey(1, 2)) and s.cache.is_resident(ExpertKey(1, 3))
    s.on_route(1, np.array([[0, 2]]))  # 0: a hit; 2: read ahead, so a miss; 3 was wrong
    st = s.stats()
    assert (st.hits, st.misses, st.guess_hits, st.wasted_bytes) == (1, 3, 1, per)
    assert st.read_bytes == 3 * per + st.wasted_bytes
    assert s.cache.is_resident(ExpertKey(1, 3))  # a wrong guess stays cached like any expert
    assert_in_place(s, layout, data, 1, (0, 2, 3))
    # The next route of another layer may need room: guessed experts are ordinary residents now.
    s.on_route(2, np.array([[4, 5, 6, 7]]))
    assert s.stats().resident_bytes <= 6 * per
    assert_holds_exactly_its_experts(s, layout)
    s.close()


def test_read_ahead_then_a_route_that_needs_room_never_evicts_a_guess_in_flight(tmp_path: Path) -> None:
    layout, data = make_layout(tmp_path, n_expert=8, slice_nbytes=3 * 4096 + 528)
    per = layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(), budget=Budget(3 * per, 0, "fixed"), pages=MOVER)
    s.prefetch(0, np.array([0, 1]))
    s.on_route(0, np.array([[2, 3]]))  # needs 2 slots: only 1 is free besides the guesses in flight
    assert isinstance(s.cache, ExpertCache)
    assert all(s.cache.is_resident(ExpertKey(0, e)) for e in (0, 1, 2, 3))  # over budget until the next route
    assert_in_place(s, layout, data, 0, (0, 1, 2, 3))
    s.on_route(1, np.array([[0]]))
    assert s.stats().resident_bytes <= 3 * per
    assert_holds_exactly_its_experts(s, layout)
    s.close()


class _Spy:
    """Stands in for libc in bmoe.llama.mremap_mover: records each call, forwards it (or fails mremap
    with ``fail_errno`` while it is set)."""

    def __init__(self, fail_errno: int | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail_errno = fail_errno

    def mremap(self, src, src_len, dst_len, flags, dst):  # noqa: ANN001
        self.calls.append(("mremap", flags))
        if self.fail_errno is not None and flags & libc_consts.MREMAP_DONTUNMAP:
            ctypes.set_errno(self.fail_errno)
            return libc_consts.MAP_FAILED
        return libc_consts.libc.mremap(src, src_len, dst_len, flags, dst)

    def mmap(self, *args):  # noqa: ANN002
        self.calls.append(("mmap", 0))
        return libc_consts.libc.mmap(*args)

    def madvise(self, *args):  # noqa: ANN002
        self.calls.append(("madvise", 0))
        return libc_consts.libc.madvise(*args)


def _two_experts_of_pages(n_first: int, n_second: int) -> tuple[mmap.mmap, int, int]:
    """A private anonymous buffer with two ranges of ``n_first`` and ``n_second`` pages, the first
    written (committed), a gap page between them; returns it and the two ranges' addresses."""
    buf = mmap.mmap(-1, (n_first + n_second + 1) * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    buf[: n_first * PAGE] = bytes(range(256)) * (n_first * PAGE // 256)
    return buf, addr, addr + (n_first + 1) * PAGE


@pytest.mark.parametrize(
    "n_dst, want", [(4, ["mremap"]), (5, ["mremap", "mmap", "madvise"])], ids=["same-length", "resizing"]
)
def test_a_move_is_one_mremap_where_the_lengths_agree(monkeypatch: pytest.MonkeyPatch, n_dst: int, want) -> None:
    spy = _Spy()
    monkeypatch.setattr(pages_mod, "libc", spy)
    buf, src, dst = _two_experts_of_pages(4, n_dst)
    mover = LibcPageMover(dontunmap=True)
    mover.move(src, 4 * PAGE, dst, n_dst * PAGE)
    assert [c for c, _ in spy.calls] == want and mover.dontunmap
    off = dst - src  # the destination holds the source's bytes; the source reads as zeros
    assert buf[off : off + 4 * PAGE] == bytes(range(256)) * (4 * PAGE // 256)
    assert buf[: 4 * PAGE] == bytes(4 * PAGE)
    buf[:PAGE] = b"x" * PAGE  # the source range is still ordinary writable memory
    buf.close()


@pytest.mark.parametrize("err", [errno.EINVAL, errno.ENOMEM])
def test_a_kernel_that_refuses_the_one_call_move_gets_the_three_call_move_from_then_on(
    monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    spy = _Spy(fail_errno=err)
    monkeypatch.setattr(pages_mod, "libc", spy)
    buf, src, dst = _two_experts_of_pages(4, 4)
    mover = LibcPageMover(dontunmap=True)
    mover.move(src, 4 * PAGE, dst, 4 * PAGE)
    assert [c for c, _ in spy.calls] == ["mremap", "mremap", "mmap", "madvise"] and not mover.dontunmap
    assert buf[dst - src : dst - src + 4 * PAGE] == bytes(range(256)) * (4 * PAGE // 256)
    spy.calls.clear()
    mover.move(dst, 4 * PAGE, src, 4 * PAGE)  # and back, without trying again
    assert [c for c, _ in spy.calls] == ["mremap", "mmap", "madvise"]
    assert buf[: 4 * PAGE] == bytes(range(256)) * (4 * PAGE // 256)
    buf.close()


def test_another_refusal_of_the_one_call_move_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pages_mod, "libc", _Spy(fail_errno=errno.EFAULT))
    mover = LibcPageMover(dontunmap=True)
    with pytest.raises(OSError, match="mremap"):
        mover.move(PAGE, PAGE, 2 * PAGE, PAGE)


def test_the_one_call_move_is_used_only_where_the_mappings_it_leaves_fit_under_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pages_mod, "_max_map_count", lambda: 65530)
    qwen3_30b, qwen3_235b = 48 * 3 * 128, 94 * 3 * 128
    assert LibcPageMover.available(qwen3_30b).dontunmap
    assert not LibcPageMover.available(qwen3_235b).dontunmap
    monkeypatch.setattr(pages_mod, "_max_map_count", lambda: 262144)  # a raised cap lets it through
    assert LibcPageMover.available(qwen3_235b).dontunmap


def test_a_bigger_victim_moved_to_a_smaller_slice_counts_the_cut_pages_as_released(tmp_path: Path) -> None:
    # Layer 0's slices (12 pages + 100 bytes) are bigger than layer 1's (5 pages + 100): when layer
    # 1 takes layer 0's pages, the pages past its slice's size are dropped. Every page the victims
    # covered is then either moved or released, and the counts say so.
    from bmoe.stream.layout import FileId, ModelLayout
    from helpers.stream import PROJS

    n_expert, sizes = 8, {0: 12 * 4096 + 100, 1: 5 * 4096 + 100}
    experts, off = [], 1056
    for il, size in sizes.items():
        for proj in PROJS:
            experts.append(ExpertTensor(f"blk.{il}.{proj}.weight", il, proj, 0, off, n_expert * size, n_expert))
            off += n_expert * size + 32
    data = np.random.default_rng(5).integers(0, 256, off + 4096, dtype=np.uint8).tobytes()
    (tmp_path / "experts.bin").write_bytes(data)
    layout = ModelLayout(
        "qwen3moe", (FileId.of(tmp_path / "experts.bin"),), tuple(experts), n_expert, 2, 1056, off - 1056
    )
    s = Streamer(
        layout, StreamSettings(), budget=Budget(2 * layout.expert_nbytes_in_layer(0), 0, "fixed"), pages=LibcPageMover()
    )
    assert isinstance(s.cache, ExpertCache)
    s.on_route(0, np.array([[1, 2]]))
    covered = 0  # the pages of layer 0's experts 1 and 2, whose neighbours 0 and 3 are not cached
    for t in layout.layer_tensors(0):
        start = t.offset % 4096 + t.slice_nbytes
        covered += -(-(start + 2 * t.slice_nbytes) // PAGE) * PAGE - (start // PAGE) * PAGE
    s.on_route(1, np.array([[3, 4, 5, 6, 7]]))  # needs all the room: evicts both, takes their pages
    assert not s.cache.is_resident(ExpertKey(0, 1)) and not s.cache.is_resident(ExpertKey(0, 2))
    assert s.cache.moved_bytes > 0
    assert s.cache.moved_bytes + s.cache.released_bytes == covered
    assert_in_place(s, layout, data, 1, (3, 4, 5, 6, 7))
    assert_holds_exactly_its_experts(s, layout)
    s.close()
