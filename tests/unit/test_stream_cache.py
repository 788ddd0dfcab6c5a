"""The expert cache's buffers, budgets and page release, over a synthetic layout (no llama.cpp
needed). Which experts stay (the policy) is tested on keys alone in test_stream_policy.py."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

from bmoe.stream import CacheBudgetError, ExpertKey, Streamer, StreamSettings
from bmoe.stream.budget import MIB, Budget, resolve_budget
from bmoe.stream.cache import ExpertCache, SharedBuffers
from helpers.stream import expert_bytes_in_buffer, make_layout


def test_lru_counts_budget_and_resident_bytes_are_exact(tmp_path: Path) -> None:
    layout, data = make_layout(tmp_path)
    per = layout.expert_nbytes_in_layer(0)
    budget = layout.floor_bytes() + 2 * per
    s = Streamer(layout, StreamSettings(cache_mb=1), budget=Budget(budget, layout.floor_bytes(), "fixed"))
    rng = np.random.default_rng(0)
    routed = 0
    for token in range(30):
        for il in layout.layers:
            ids = rng.choice(layout.n_expert, size=(1, 2), replace=False)
            s.on_route(il, ids)
            routed += 2
            for e in ids.ravel():  # every routed expert is present, byte for byte, at its place
                for t in layout.layer_tensors(il):
                    assert expert_bytes_in_buffer(s, t, int(e)) == data[t.slice_offset(int(e)) :][: t.slice_nbytes]
            st = s.stats()
            assert st.resident_bytes <= st.budget_bytes
    st = s.stats()
    assert st.routed == routed == st.hits + st.misses
    assert st.evictions > 0 and st.hits > 0
    assert st.read_bytes == st.misses * per
    assert st.resident_bytes == (st.misses - st.evictions) * per
    s.close()


def test_cache_off_rereads_every_routed_slice(tmp_path: Path) -> None:
    layout, data = make_layout(tmp_path)
    s = Streamer(layout, StreamSettings(), budget=Budget(0, layout.floor_bytes(), "off"))
    assert isinstance(s.cache, SharedBuffers)
    # all layers share one buffer per projection
    assert (
        len({s.binding(t.name).data_addr - (t.offset % 4096) for t in layout.experts if t.proj == "ffn_up_exps"}) == 1
    )
    for _ in range(3):
        s.on_route(1, np.array([[5, 2], [2, 7]]))  # a 2-token ubatch: union {2, 5, 7}
    st = s.stats()
    assert (st.routed, st.misses, st.hits, st.evictions, st.resident_bytes) == (9, 9, 0, 0, 0)
    assert st.read_bytes == 9 * layout.expert_nbytes_in_layer(1)
    for t in layout.layer_tensors(1):
        assert expert_bytes_in_buffer(s, t, 7) == data[t.slice_offset(7) :][: t.slice_nbytes]
    s.close()


def test_prefill_union_larger_than_budget_still_loads_then_shrinks(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path)
    per = layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(), budget=Budget(3 * per, 0, "fixed"))
    s.on_route(0, np.arange(8).reshape(4, 2))  # all 8 experts of layer 0: over budget for now
    assert s.stats().resident_bytes == 8 * per
    s.on_route(1, np.array([[0, 1]]))  # the next route evicts back under budget
    assert s.stats().resident_bytes <= 3 * per
    s.close()


def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def test_eviction_returns_pages_to_the_os(tmp_path: Path) -> None:
    # 4 layers x 8 experts x 3 x 1 MiB+: big enough to see in RssAnon over allocator noise.
    layout, _ = make_layout(tmp_path, slice_nbytes=(1 << 20) + 96)
    per = layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(odirect=False), budget=Budget(8 * per, 0, "fixed"))
    before = _rss_anon()
    s.on_route(0, np.arange(8).reshape(1, 8))
    grown = _rss_anon() - before
    assert grown >= 8 * per - MIB
    s.on_route(1, np.arange(8).reshape(1, 8))  # evicts all of layer 0
    assert s.stats().evictions == 8
    assert isinstance(s.cache, ExpertCache)
    assert s.cache.released_bytes >= 8 * per - 3 * 2 * 4096  # all but shared boundary pages
    assert _rss_anon() - before <= grown + 2 * MIB  # layer 1 came in, layer 0 went out
    s.close()


def test_page_shared_with_a_resident_neighbour_is_kept(tmp_path: Path) -> None:
    layout, data = make_layout(tmp_path, n_expert=8, slice_nbytes=6528)
    per = layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(), budget=Budget(2 * per, 0, "fixed"))
    s.on_route(0, np.array([[3, 4]]))
    s.on_route(0, np.array([[4]]))  # 4 is now the most recent
    s.on_route(0, np.array([[5]]))  # evicts 3; its last page is shared with 4 and must survive
    assert s.cache.is_resident(ExpertKey(0, 4)) and not s.cache.is_resident(ExpertKey(0, 3))
    for t in layout.layer_tensors(0):
        assert expert_bytes_in_buffer(s, t, 4) == data[t.slice_offset(4) :][: t.slice_nbytes]
    s.close()


def test_neighbours_evicted_together_release_their_shared_page_once(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path, n_expert=8, slice_nbytes=6528)  # slices straddle pages
    per = layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(), budget=Budget(2 * per, 0, "fixed"))
    s.on_route(0, np.array([[3, 4]]))
    s.on_route(0, np.array([[6, 7]]))  # evicts 3 and 4 in one plan
    assert s.stats().evictions == 2
    expected = 0
    for t in layout.layer_tensors(0):
        start = t.offset % 4096 + 3 * t.slice_nbytes
        end = start + 2 * t.slice_nbytes
        expected += -(-end // mmap.PAGESIZE) * mmap.PAGESIZE - (start // mmap.PAGESIZE) * mmap.PAGESIZE
    assert isinstance(s.cache, ExpertCache)
    assert s.cache.released_bytes == expected  # the page 3 and 4 share is released, and counted, once
    s.close()


def test_floor_refusal_names_the_floor(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path, slice_nbytes=1 << 20)  # floor = 4 layers x 2 x 3 MiB = 24 MiB
    with pytest.raises(CacheBudgetError) as err:
        resolve_budget(StreamSettings(cache_mb=23), layout)
    assert str(err.value) == (
        "cache_mb: 23 is below the floor of 24 MiB, one token's routed experts (4 layers x 2 experts x "
        "3.00 MiB); a smaller cache only churns. Give 24 or more, 0 (cache off), or set cache_force"
    )
    assert resolve_budget(StreamSettings(cache_mb=24), layout).budget_bytes == 24 * MIB
    forced = resolve_budget(StreamSettings(cache_mb=1, cache_force=True), layout)
    assert forced.budget_bytes == MIB and forced.source == "fixed"
    assert resolve_budget(StreamSettings(cache_mb=0), layout).budget_bytes == 0


def test_auto_budget_uses_free_memory_ceiling_and_floor(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path, slice_nbytes=1 << 20)  # floor = 4 x 2 x 3 MiB = 24 MiB
    assert layout.floor_bytes() == 24 * MIB
    b = resolve_budget(StreamSettings(cache_mb="auto"), layout, available=lambda: 80 * MIB)
    assert (b.budget_bytes, b.source) == (40 * MIB, "auto")
    b = resolve_budget(StreamSettings(cache_mb="auto", cache_ceil_mb=30), layout, available=lambda: 80 * MIB)
    assert b.budget_bytes == 30 * MIB
    b = resolve_budget(StreamSettings(cache_mb="auto"), layout, available=lambda: 1 << 40)
    assert b.budget_bytes == layout.expert_nbytes  # never more than all experts
    said: list[str] = []
    b = resolve_budget(StreamSettings(cache_mb="auto"), layout, available=lambda: 10 * MIB, warn=said.append)
    assert (b.budget_bytes, b.source) == (0, "auto-below-floor") and "24 MiB floor" in said[0]
    # Malformed values never get here: SessionConfig refuses them (tests/unit/test_config.py).


def test_route_with_bad_ids_is_a_sticky_error(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path)
    s = Streamer(layout, StreamSettings(), budget=Budget(0, 0, "off"))
    with pytest.raises(Exception, match="outside 0..7"):
        s.on_route(0, np.array([[1, 9]]))
    with pytest.raises(Exception, match="outside 0..7"):
        s.on_route(0, np.array([[1, 2]]))
    assert s.error is not None
    s.close()


def test_page_size_assumption() -> None:
    assert mmap.PAGESIZE == 4096 or mmap.PAGESIZE % 4096 == 0
