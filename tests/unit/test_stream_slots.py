"""The slot cache (SlotCache): experts of every layer in shared pools of slots, reads straight into a
victim's slot, the slot map the hook renumbers the routed ids by. Over synthetic layouts (no llama.cpp)."""

from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bmoe.stream import ExpertKey, Streamer, StreamSettings
from bmoe.stream.budget import Budget
from bmoe.stream.cache import PAGE, ExpertCache, SlotCache, slots_refusal
from bmoe.stream.layout import ExpertTensor, ModelLayout
from helpers.stream import make_layout

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def _slot_bytes(cache: SlotCache, t: ExpertTensor, e: int) -> bytes:
    """Expert ``e`` of ``t`` as its matmul reads it: at data + slot * nb[2]."""
    k = cache.slot_of(ExpertKey(t.il, e))
    assert k is not None
    buf = cache._buffers[(t.proj, t.slice_nbytes)]
    start = cache.data_addr(t) - buf.window.addr + k * cache.expert_stride(t)
    return bytes(buf.window.view[start : start + t.slice_nbytes])


def _check_all_resident(s: Streamer, layout: ModelLayout, data: bytes) -> int:
    """Every resident expert is in its slot byte for byte (a read that spilt into a neighbouring
    slot would show here), and the slot map agrees with the slots; returns how many are resident."""
    cache = s.cache
    assert isinstance(cache, SlotCache)
    n = 0
    for il in layout.layers:
        m = cache.slot_map(il)
        for e in range(layout.n_expert):
            k = cache.slot_of(ExpertKey(il, e))
            assert m[e] == (-1 if k is None else k)
            if k is None:
                continue
            n += 1
            for t in layout.layer_tensors(il):
                assert _slot_bytes(cache, t, e) == data[t.slice_offset(e) :][: t.slice_nbytes]
    slots = [
        k
        for k in (cache.slot_of(ExpertKey(il, e)) for il in layout.layers for e in range(layout.n_expert))
        if k is not None
    ]
    assert len(slots) == len(set(slots)) == n  # no slot holds two experts
    return n


@pytest.mark.parametrize("slice_nbytes", [6528, 3 * PAGE])  # straddles pages / whole pages (O_DIRECT in place)
@pytest.mark.parametrize("odirect", [True, False])
def test_random_routes_keep_every_resident_expert_in_its_slot(tmp_path: Path, slice_nbytes: int, odirect: bool) -> None:
    layout, data = make_layout(tmp_path, n_layer=4, n_expert=8, slice_nbytes=slice_nbytes)
    per = layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(odirect=odirect), budget=Budget(5 * per, 0, "fixed"), slots=True)
    cache = s.cache
    assert isinstance(cache, SlotCache) and s.slots
    assert cache.n_slots == 5 + 2 * 8
    rng = np.random.default_rng(1)
    for step in range(60):
        il = layout.layers[step % 4]
        n_tok = 1 if step % 5 else 3  # now and then a small prefill ubatch
        ids = np.stack([rng.choice(8, size=2, replace=False) for _ in range(n_tok)])
        s.on_route(il, ids)
        assert cache.slot_map(il)[ids].min() >= 0  # what the hook renumbers the ids by
        _check_all_resident(s, layout, data)
        assert s.stats().resident_bytes <= max(5 * per, 3 * 2 * per)
    st = s.stats()
    assert st.evictions > 0 and st.hits > 0 and st.read_bytes == st.misses * per
    # Every victim's slot went to an incoming expert of the same pools: nothing moved, nothing left behind.
    assert cache.reused_bytes > 0 and cache.high_water <= cache.n_slots
    s.close()


def test_bindings_point_every_layer_at_one_pool_with_the_slot_stride(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path, slice_nbytes=3 * PAGE)
    s = Streamer(layout, StreamSettings(), budget=Budget(3 * layout.expert_nbytes_in_layer(0), 0, "fixed"), slots=True)
    ups = [s.binding(t.name) for t in layout.experts if t.proj == "ffn_up_exps"]
    assert {b.n_slots for b in ups} == {s.cache.n_slots} and {b.expert_stride for b in ups} == {4 * PAGE}
    # one pool: the layers differ only by their own offset modulo the page
    assert (
        len(
            {b.data_addr - t.offset % 4096 for b, t in zip(ups, [t for t in layout.experts if t.proj == "ffn_up_exps"])}
        )
        == 1
    )
    s.close()


def _two_layers(tmp_path: Path, n_budget: int) -> tuple[ModelLayout, bytes, Streamer, SlotCache]:
    """2 layers x 8 experts of 3-page slices, a slot cache of ``n_budget`` experts."""
    layout, data = make_layout(tmp_path, n_layer=2, n_expert=8, slice_nbytes=3 * PAGE)
    s = Streamer(
        layout, StreamSettings(), budget=Budget(n_budget * layout.expert_nbytes_in_layer(0), 0, "fixed"), slots=True
    )
    assert isinstance(s.cache, SlotCache)
    return layout, data, s, s.cache


def test_a_victims_slot_is_read_into_without_release(tmp_path: Path) -> None:
    layout, data, s, cache = _two_layers(tmp_path, 2)
    s.on_route(0, np.array([[3, 4]]))
    k3, k4 = cache.slot_of(ExpertKey(0, 3)), cache.slot_of(ExpertKey(0, 4))
    assert {k3, k4} == {0, 1}  # the lowest free slots
    s.on_route(1, np.array([[6, 7]]))  # evicts both of layer 0: layer 1 takes their slots
    assert {cache.slot_of(ExpertKey(1, 6)), cache.slot_of(ExpertKey(1, 7))} == {k3, k4}
    assert cache.slot_map(0).max() == -1
    assert cache.released_bytes == 0 and cache.reused_bytes == 2 * 3 * 4 * PAGE
    _check_all_resident(s, layout, data)
    s.on_route(1, np.array([[6]]))  # a hit: nothing read
    assert s.stats().hits == 1
    s.close()


def test_a_slot_nobody_takes_is_released(tmp_path: Path) -> None:
    _, _, s, cache = _two_layers(tmp_path, 3)
    s.on_route(0, np.arange(8).reshape(4, 2))  # a wide route of all 8: over budget for now
    assert cache.high_water == 8
    s.on_route(1, np.array([[0]]))  # back under budget: 6 victims, 1 newcomer
    assert s.stats().evictions == 6
    assert cache.reused_bytes == 3 * 4 * PAGE and cache.released_bytes == 5 * 3 * 4 * PAGE
    s.close()


def test_mixed_pools_release_the_pool_the_newcomer_does_not_use(tmp_path: Path) -> None:
    """Layer 1's down projection has slices of another size (another quantization): a slot handed
    from layer 0 to layer 1 keeps its gate and up pages and gives back its down pages."""
    layout, data = make_layout(tmp_path, n_layer=2, n_expert=8, slice_nbytes=3 * PAGE)
    t = next(t for t in layout.experts if t.il == 1 and t.proj == "ffn_down_exps")
    small = replace(t, nbytes=t.n_expert * 2 * PAGE)
    layout = replace(layout, experts=tuple(small if x is t else x for x in layout.experts))
    s = Streamer(layout, StreamSettings(), budget=Budget(2 * layout.expert_nbytes_in_layer(0), 0, "fixed"), slots=True)
    cache = s.cache
    assert isinstance(cache, SlotCache) and len(cache._buffers) == 4
    s.on_route(0, np.array([[1, 2]]))
    s.on_route(1, np.array([[5, 6]]))
    assert s.stats().evictions == 2
    assert cache.released_bytes == 2 * 4 * PAGE  # layer 0's down pages of the two slots
    assert cache.reused_bytes == 2 * 2 * 4 * PAGE  # their gate and up pages
    _check_all_resident(s, layout, data)
    s.close()


def test_read_ahead_assigns_slots_and_never_takes_a_busy_one(tmp_path: Path) -> None:
    layout, data = make_layout(tmp_path, n_layer=3, n_expert=8, slice_nbytes=6528)
    per = layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(), budget=Budget(3 * per, 0, "fixed"), slots=True)
    cache = s.cache
    assert isinstance(cache, SlotCache)
    s.on_route(0, np.array([[0, 1], [2, 3]]))  # a wide route, its matmuls still to run
    s.prefetch(1, np.array([4, 5, 6, 7]), early=True)  # the guess of layer 1, two layers deep
    held = {cache.slot_of(ExpertKey(0, e)) for e in range(4)}
    assert None not in held and held.isdisjoint({cache.slot_of(ExpertKey(1, e)) for e in range(4, 8)})
    s.on_route(1, np.array([[4, 0]]))
    assert all(cache.slot_map(1)[[4, 0]] >= 0)
    s.drain()
    _check_all_resident(s, layout, data)
    assert cache.high_water <= 8 + 3
    s.close()


def test_slots_refused_where_other_tensors_gather_by_the_ids(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path)
    gpt = replace(layout, expert_side=("blk.0.ffn_gate_exps.bias", "blk.0.ffn_up_exps.bias"))
    assert slots_refusal(layout) == ""
    assert "ffn_gate_exps.bias" in slots_refusal(gpt)
    s = Streamer(gpt, StreamSettings(), budget=Budget(3 * gpt.expert_nbytes_in_layer(0), 0, "fixed"), slots=True)
    assert isinstance(s.cache, ExpertCache) and not s.slots  # page moves instead
    with pytest.raises(ValueError, match="no slots"):
        s.slot_map(0)
    s.close()
    with pytest.raises(ValueError, match="gathered by the routed ids"):
        SlotCache(gpt, 1 << 20)


def _held(buf) -> set[int]:  # noqa: ANN001 - a TensorBuffer
    """Pages of ``buf`` that have a physical page now (mincore), as page indexes."""
    n = buf.size // PAGE
    vec = (ctypes.c_ubyte * n)()
    assert _libc.mincore(buf.window.addr, buf.size, vec) == 0
    return {i for i in range(n) if vec[i] & 1}


@pytest.mark.parametrize("slice_nbytes", [12 * PAGE + 528, 12 * PAGE])
@pytest.mark.parametrize("odirect", [True, False])
def test_pools_hold_only_resident_slots_and_decide_as_page_moves_do(
    tmp_path: Path, slice_nbytes: int, odirect: bool
) -> None:
    layout, data = make_layout(tmp_path, n_expert=8, slice_nbytes=slice_nbytes)
    per = layout.expert_nbytes_in_layer(0)
    runs = {}
    for slots in (True, False):
        s = Streamer(layout, StreamSettings(odirect=odirect), budget=Budget(5 * per, 0, "fixed"), slots=slots)
        rng = np.random.default_rng(3)
        for r in range(25):
            for il in layout.layers:
                s.on_route(il, rng.choice(layout.n_expert, size=(3 if r % 7 == 3 else 1, 2)))
        if slots:
            cache = s.cache
            assert isinstance(cache, SlotCache)
            _check_all_resident(s, layout, data)
            for t in (t for t in layout.experts if t.il == 0):  # one tensor per pool
                pool = (t.proj, t.slice_nbytes)
                stride = cache.stride[pool] // PAGE
                mine = [cache.slot_of(ExpertKey(il, e)) for il in layout.layers for e in range(8)]
                allowed = {k * stride + i for k in mine if k is not None for i in range(stride)}
                held = _held(cache._buffers[pool])
                assert held <= allowed  # nothing outside a resident expert's slot holds memory
                # and every resident expert's slice is backed (its own layer's pad in the slot)
                for il in layout.layers:
                    tl = next(x for x in layout.layer_tensors(il) if x.proj == t.proj)
                    for e in range(8):
                        k = cache.slot_of(ExpertKey(il, e))
                        if k is not None:
                            lo = k * cache.stride[pool] + tl.offset % 4096
                            assert set(range(lo // PAGE, -(-(lo + tl.slice_nbytes) // PAGE))) <= held
        st = s.stats()
        runs[slots] = (st.hits, st.misses, st.evictions, st.read_bytes)
        assert st.resident_bytes <= 5 * per and st.evictions > 20
        s.close()
    assert runs[True] == runs[False]  # slots change where experts live, not which ones stay
